#pragma once
// The classifier head after the blocks, as each library computes it from the tokens forward()
// returns (timm VisionTransformer.forward_head, VisionTransformerDistilled.forward_head;
// transformers ViTForImageClassification, DeiTForImageClassification(WithTeacher)):
//   pooled = pool(tokens)         config.head_pool: the class token, or the mean / max / both over
//                                 the patch tokens (prefix tokens left out unless
//                                 pool_include_prefix), as timm's global_pool_nlc
//   pooled = fc_norm(pooled)      when the model has one (timm fc_norm; its final norm is then off)
//   logits = head(pooled)         nn.Linear (C, D)
// A distilled DeiT (head_dist) gives (head(x[:, 0]) + head_dist(x[:, 1])) / 2, the eval output of
// both libraries. Then the top classes with softmax probabilities, for the viewer, the CLI and the
// export record.
//
// Padding: in the whole-image mode the padded patches are not part of the image, and the library
// never sees them (it sees the image its own transform made); average and max pooling read only
// the patches that are image. With the model's own preprocessing there is no padding.
#include <string>
#include <vector>

#include "core/model/vit.hpp"

namespace vitlens {

// The pooling the model's head reads: Auto resolved (Token with a class token, else Avg).
HeadPool resolved_head_pool(const VitConfig& config);

// Logits (C) of the model's classifier for one forward pass; empty when the model has none.
// Sums in double; the tokens are forward()'s float32 output.
std::vector<float> classifier_logits(const VitModel& model, const ForwardResult& result);

struct ClassScore {
  int index = 0;             // the class's row of the head
  float logit = 0.0f;
  double probability = 0.0;  // softmax over all C logits (in double)
};
// The k most probable classes, highest first; equal logits keep the lower index first.
std::vector<ClassScore> top_classes(const std::vector<float>& logits, int k);
constexpr int kTopClasses = 5;  // what the viewer, the CLI and the export record show

// A class's name: model.class_names[index], or "class <index>" when the model has no names.
std::string class_label(const VitModel& model, int index);

// One line about the classifier for `vitlens info` and the export record: "10 classes (names from
// the training record), class token" or "none: the model has no classifier head".
std::string classifier_summary(const VitModel& model);

// The export record's and the viewer's state: {"classes", "pool", "fc_norm", "distilled", "names",
// "padding"} beside "predictions": [{"rank", "index", "label", "probability", "logit"}...].
struct Predictions {
  bool has_classifier = false;
  std::vector<ClassScore> top;  // kTopClasses (or C when fewer), highest first
  std::vector<std::string> labels;  // class_label of each of top
  int pooled_patches = 0;       // the patch tokens Avg/Max read (image patches only); 0 for Token
  int padding_patches = 0;      // padded patches left out of the pool
};
// classifier_logits + top_classes + labels; has_classifier false (and nothing else) without a head.
Predictions predict(const VitModel& model, const ForwardResult& result);

// One prediction as the CLI and the viewer show it: "1.  87.31 %  tabby cat" (rank from 1).
std::string prediction_line(int rank, double probability, const std::string& label);

}  // namespace vitlens
