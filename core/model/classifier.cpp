// The classifier head after the blocks (classifier.hpp), step by step as timm's forward_head.
#include "core/model/classifier.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <numeric>

#include "core/base/error.hpp"

namespace vitlens {

namespace {

// Which rows the pool reads: the image's patch tokens, plus the prefix tokens with
// pool_include_prefix. Padding patches are never part of it (classifier.hpp, "Padding").
std::vector<int> pooled_rows(const VitConfig& cfg, const ForwardResult& result) {
  std::vector<int> rows;
  if (cfg.pool_include_prefix)
    for (int t = 0; t < result.prefix; ++t) rows.push_back(t);
  for (int t = result.prefix; t < result.tokens; ++t) {
    const size_t patch = static_cast<size_t>(t - result.prefix);
    if (patch < result.patch_is_padding.size() && result.patch_is_padding[patch]) continue;
    rows.push_back(t);
  }
  return rows;
}

// x = global_pool_nlc(x, pool_type), or timm's 'map': the attention pool's output: (D) in double.
std::vector<double> pool_tokens(const VitConfig& cfg, const ForwardResult& result) {
  const int dim = static_cast<int>(result.output.cols());
  std::vector<double> pooled(static_cast<size_t>(dim), 0.0);
  const HeadPool pool = resolved_head_pool(cfg);
  if (pool == HeadPool::Map) {
    if (result.pooled.rows() != 1 || result.pooled.cols() != dim)
      throw Error("the classifier reads the attention pool's output, but this forward has none");
    for (int c = 0; c < dim; ++c) pooled[static_cast<size_t>(c)] = result.pooled(0, c);
    return pooled;
  }
  if (pool == HeadPool::Token) {
    for (int c = 0; c < dim; ++c) pooled[static_cast<size_t>(c)] = result.output(cfg.class_index(), c);
    return pooled;
  }
  const std::vector<int> rows = pooled_rows(cfg, result);
  if (rows.empty()) throw Error("the classifier's pool has no token to read");
  std::vector<double> mean(static_cast<size_t>(dim), 0.0), max(static_cast<size_t>(dim), -INFINITY);
  for (int r : rows)
    for (int c = 0; c < dim; ++c) {
      const double v = result.output(r, c);
      mean[static_cast<size_t>(c)] += v;
      max[static_cast<size_t>(c)] = std::max(max[static_cast<size_t>(c)], v);
    }
  for (double& v : mean) v /= static_cast<double>(rows.size());
  for (size_t c = 0; c < pooled.size(); ++c)
    pooled[c] = pool == HeadPool::Avg ? mean[c] : pool == HeadPool::Max ? max[c] : 0.5 * (max[c] + mean[c]);
  return pooled;
}

// x = self.fc_norm(x): LayerNorm over D (biased variance, as torch), in place.
void layer_norm_vector(std::vector<double>& x, const float* weight, const float* bias, float eps) {
  const double n = static_cast<double>(x.size());
  const double mean = std::accumulate(x.begin(), x.end(), 0.0) / n;
  double var = 0.0;
  for (double v : x) var += (v - mean) * (v - mean);
  const double inv = 1.0 / std::sqrt(var / n + static_cast<double>(eps));
  for (size_t c = 0; c < x.size(); ++c) x[c] = (x[c] - mean) * inv * weight[c] + bias[c];
}

// logits += scale * (W x + b): nn.Linear (C, D), accumulated in double.
void add_linear(const float* w, const float* b, const std::vector<double>& x, int classes, double scale,
                std::vector<double>& logits) {
  const size_t dim = x.size();
  for (int k = 0; k < classes; ++k) {
    double sum = b[k];
    const float* row = w + static_cast<size_t>(k) * dim;
    for (size_t c = 0; c < dim; ++c) sum += static_cast<double>(row[c]) * x[c];
    logits[static_cast<size_t>(k)] += scale * sum;
  }
}

std::vector<double> token_row(const ForwardResult& result, int token) {
  std::vector<double> x(static_cast<size_t>(result.output.cols()));
  for (size_t c = 0; c < x.size(); ++c) x[c] = result.output(token, static_cast<Eigen::Index>(c));
  return x;
}

}  // namespace

HeadPool resolved_head_pool(const VitConfig& config) {
  if (config.head_pool != HeadPool::Auto) return config.head_pool;
  return config.class_token ? HeadPool::Token : HeadPool::Avg;
}

std::vector<float> classifier_logits(const VitModel& model, const ForwardResult& result) {
  const VitConfig& cfg = model.config;
  const VitWeights& w = model.w;
  const int classes = w.num_classes;
  if (classes < 1 || !w.head_w || !w.head_b) return {};
  if (result.output.rows() != result.tokens || result.output.cols() != cfg.embed_dim)
    throw Error("the classifier needs a forward pass's tokens (" + std::to_string(result.tokens) + " x " +
                std::to_string(cfg.embed_dim) + ")");
  std::vector<double> logits(static_cast<size_t>(classes), 0.0);
  if (w.head_dist_w && w.head_dist_b && cfg.dist_token) {
    // timm VisionTransformerDistilled.forward_head (eval), transformers DeiTForImageClassificationWithTeacher:
    //   (head(x[:, 0]) + head_dist(x[:, 1])) / 2
    add_linear(w.head_w, w.head_b, token_row(result, cfg.class_index()), classes, 0.5, logits);
    add_linear(w.head_dist_w, w.head_dist_b, token_row(result, cfg.dist_index()), classes, 0.5, logits);
  } else {
    // x = self.pool(x); x = self.fc_norm(x); x = self.head(x)
    std::vector<double> pooled = pool_tokens(cfg, result);
    if (w.fc_norm_w && w.fc_norm_b) layer_norm_vector(pooled, w.fc_norm_w, w.fc_norm_b, cfg.norm_eps);
    add_linear(w.head_w, w.head_b, pooled, classes, 1.0, logits);
  }
  std::vector<float> out(logits.size());
  for (size_t k = 0; k < logits.size(); ++k) out[k] = static_cast<float>(logits[k]);
  for (float v : out)
    if (!std::isfinite(v)) throw Error("model '" + cfg.name + "' gives non-finite logits (NaN or infinity) on this image");
  return out;
}

std::vector<ClassScore> top_classes(const std::vector<float>& logits, int k) {
  if (logits.empty() || k < 1) return {};
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t keep = std::min(order.size(), static_cast<size_t>(k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), [&](int a, int b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  // softmax in double, shifted by the largest logit
  const double top = logits[static_cast<size_t>(order[0])];
  double total = 0.0;
  for (float v : logits) total += std::exp(static_cast<double>(v) - top);
  std::vector<ClassScore> out;
  for (size_t i = 0; i < keep; ++i) {
    ClassScore s;
    s.index = order[i];
    s.logit = logits[static_cast<size_t>(s.index)];
    s.probability = std::exp(static_cast<double>(s.logit) - top) / total;
    out.push_back(s);
  }
  return out;
}

std::string class_label(const VitModel& model, int index) {
  if (index >= 0 && static_cast<size_t>(index) < model.class_names.size() && !model.class_names[static_cast<size_t>(index)].empty())
    return model.class_names[static_cast<size_t>(index)];
  return "class " + std::to_string(index);
}

std::string classifier_summary(const VitModel& model) {
  const VitWeights& w = model.w;
  if (w.num_classes < 1 || !w.head_w) return "none: the model has no classifier head, so there are no predictions";
  std::string line = std::to_string(w.num_classes) + " classes (" +
                     (model.class_names.empty() ? std::string("no class names: shown as 'class N'")
                                                : "names from " + model.class_names_source) +
                     "), ";
  if (w.head_dist_w && model.config.dist_token) return line + "mean of the class and distillation tokens' heads";
  const HeadPool pool = resolved_head_pool(model.config);
  line += pool == HeadPool::Token ? "class token"
          : pool == HeadPool::Map ? "the attention pool's output"
                                  : std::string(head_pool_name(pool)) + " pool over the patch tokens";
  if (pool != HeadPool::Token && pool != HeadPool::Map && model.config.pool_include_prefix) line += " and the prefix tokens";
  if (w.fc_norm_w) line += ", fc_norm";
  return line;
}

std::string prediction_line(int rank, double probability, const std::string& label) {
  char text[64];
  std::snprintf(text, sizeof text, "%d. %6.2f %%  ", rank, 100.0 * probability);
  return text + label;
}

Predictions predict(const VitModel& model, const ForwardResult& result) {
  Predictions p;
  const std::vector<float> logits = classifier_logits(model, result);
  if (logits.empty()) return p;
  p.has_classifier = true;
  p.top = top_classes(logits, kTopClasses);
  for (const ClassScore& s : p.top) p.labels.push_back(class_label(model, s.index));
  if (resolved_head_pool(model.config) != HeadPool::Token && !(model.w.head_dist_w && model.config.dist_token)) {
    for (uint8_t pad : result.patch_is_padding) p.padding_patches += pad ? 1 : 0;
    p.pooled_patches = result.tokens - result.prefix - p.padding_patches;
  }
  return p;
}

}  // namespace vitlens
