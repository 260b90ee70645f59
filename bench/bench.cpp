// vitlens_bench: how fast vitlens computes attention, for the default model shape (P = 4, D = 48,
// H = 4, d = 12, one block, class token) at image sizes 64 .. 1024 px (256 .. 65536 patches).
//
// Each size runs in a fresh child process, so its peak memory is its own. Medians over repeated
// runs (at least --min-runs, at most --runs, fewer once --budget seconds are spent) of:
//   forward     vitlens::forward: every head's outputs, attention received and the class row
//   attention   the attention alone: multi_head_attention for every head of the layer (with
//               bfloat16 products when the forward's precision is bf16)
//   reference   the plain reference on the same q, k, v (scaled_dot_product_attention per head
//               plus column means): the peer the fast path is compared with in the same run
//   query map   attention_maps in query mode: one query's weights for every head
//   export      analyse_image + write_export of one S x S PNG into a temporary folder
//   peak RSS    getrusage ru_maxrss of the child, read before the reference runs
// and, unless --no-limits, the machine's limits (bench/limits.cpp: FMA GFLOP/s and exps per ns of
// one core at the vector width in use, GEMM GFLOP/s) with each forward and attention time as a
// fraction of its floor: the time the machine would need at those limits for the multiply-adds
// and exps the step does (Linear layers 2 N D (3D + D + 2 Hm) per block + patches, attention
// 4 N^2 d H flops and N^2 H exps per block; the forward's floor counts every block), spread over
// the threads.
// The weights are random: the kernels have no data-dependent branches, so timing does not care.
//
// Usage: vitlens_bench [--size S ...] [--json] [--isa auto|portable|avx2|avx512] [--threads T]
//                      [--runs R] [--min-runs R] [--budget SECONDS] [--reference-max-tokens N] [--no-export]
//                      [--no-limits] [--model FILE] [--precision fp32|bf16|auto] [--deep | --grid | --watch SECONDS]
//
// Index
//   [SECTION] Timing helpers
//   [SECTION] One size (in the child)
//   [SECTION] Output
//   [SECTION] Main
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "core/base/error.hpp"
#include "core/render/export.hpp"
#include "core/cpu/cpu.hpp"
#include "core/cpu/attention_bf16.hpp"
#include "core/cpu/fast_attention.hpp"
#include "models/bundled.hpp"
#include "core/render/layer_grid.hpp"
#include "core/base/memory.hpp"
#include "models/model_io.hpp"
#include "core/model/rollout.hpp"
#include "limits.hpp"

namespace {

using json = nlohmann::json;
using namespace vitlens;

// How many times a measurement runs: at least min_runs, at most max_runs, and no new run once
// budget_s seconds are spent.
struct RunPolicy {
  int max_runs = 9, min_runs = 3;
  double budget_s = 5.0;
};

struct BenchArgs {
  std::vector<int> sizes{64, 128, 224, 448, 1024};
  bool json_output = false;
  std::string isa = "auto";
  int threads = 0;
  RunPolicy runs;
  int reference_max_tokens = 3200;
  bool no_export = false;
  bool deep = false;  // --deep: the ViT-B/16 shape instead of the size sweep
  bool grid = false;  // --grid: the viewer's layers x heads grid on a ViT-S/16 shape
  bool no_limits = false;
  double watch_s = 0.0;  // --watch: the machine's rates over time instead
  std::string model_path;  // a vitlens safetensors model instead of the random default shape
  Precision precision = Precision::Fp32;  // --precision: the forward's products
  std::string precision_text = "fp32";    // as typed
};

// [SECTION] Timing helpers

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Times step(run index) under the policy after one untimed step(0), as compare_peers.py's peers
// get one: a model's first forward packs its Linear weights (vit.cpp's packed cache) and every
// first call faults in fresh buffers. Returns {"median", "min", "runs"}, in milliseconds.
template <class Step>
json time_runs(const RunPolicy& policy, Step&& step) {
  step(0);
  std::vector<double> samples;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(samples.size()) < policy.max_runs) {
    const auto t0 = std::chrono::steady_clock::now();
    step(static_cast<int>(samples.size()));
    samples.push_back(ms_since(t0));
    if (static_cast<int>(samples.size()) >= policy.min_runs && ms_since(start) > policy.budget_s * 1000.0) break;
  }
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  const double median = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
  return {{"median", median}, {"min", sorted.front()}, {"runs", m}};
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// The 1-minute load average: the machine is shared, so the report says how busy it was.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = -1.0;
  in >> load;
  return load;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// [SECTION] One size (in the child)

// The default model shape with N(0, 0.3^2) weights (LayerNorm weights near 1), for img x img.
VitModel bench_model(int img) {
  VitConfig c;
  c.name = "bench";
  c.patch_size = 4, c.embed_dim = 48, c.num_heads = 4, c.depth = 1;
  c.img_h = c.img_w = img;
  return model_from_tensors(c, gaussian_tensors(c, 1234, 0.3f), "bench model");
}

json bench_size(const BenchArgs& args, int img) {
  const VitModel model = args.model_path.empty() ? bench_model(img) : load_model(args.model_path);
  const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/vitlens-bench-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw Error("cannot create a temporary folder for the export");
    return tmpl;
  }();
  const std::string image_path = dir + "/bench.png";
  cv::Mat pixels(img, img, CV_8UC3);
  cv::randu(pixels, 0, 256);
  if (!cv::imwrite(image_path, pixels)) throw Error("cannot write " + image_path);

  ExportSettings settings;
  settings.out_dir = dir;
  settings.max_side = 0;  // native size: img x img, no resampling
  const PreparedImage prepared = prepare_image(load_image_rgb(image_path), model.config, 0, image_path);
  ForwardOptions options;
  options.threads = args.threads;
  options.precision = args.precision;

  json r;
  r["image"] = img;
  ForwardResult result;
  r["forward_ms"] = time_runs(args.runs, [&](int) { result = forward(model, prepared.grid, options); });
  r["tokens"] = result.tokens;
  {
    // The work of one forward, for the floors (module comment).
    const VitConfig& c = model.config;
    const double tokens = result.tokens, patches = tokens - c.prefix_tokens(), d_model = c.embed_dim;
    r["model"] = {{"patch_size", c.patch_size}, {"embed_dim", c.embed_dim}, {"num_heads", c.num_heads},
                  {"head_dim", c.head_dim()}, {"depth", c.depth}};
    // Every layer's Linear layers and the patch embedding; attention for one layer (as attention_ms).
    r["linear_gflop"] = c.depth * 2.0 * tokens * d_model * (4.0 * d_model + 2.0 * c.mlp_hidden()) * 1e-9 +
                        2.0 * patches * c.patch_values() * d_model * 1e-9;
    r["attention_gflop"] = 4.0 * tokens * tokens * c.head_dim() * c.num_heads * 1e-9;
    r["attention_gexps"] = tokens * tokens * c.num_heads * 1e-9;
  }

  // The per-query map for all heads, for queries spread over the image.
  MapRequest request;
  request.mode = MapMode::Query;
  const RunPolicy many{std::max(args.runs.max_runs, 21), std::max(args.runs.min_runs, 21), args.runs.budget_s};
  r["query_map_ms"] = time_runs(many, [&](int run) {
    request.query_token = static_cast<int>((static_cast<int64_t>(run) * 7919 + 1) % result.tokens);
    const HeadMaps maps = attention_maps(model, result, request);
    if (static_cast<int>(maps.heads.size()) != model.config.num_heads) throw Error("attention_maps gave no maps");
  });

  if (!args.no_export)
    r["export_ms"] = time_runs(args.runs, [&](int) {
      const ImageAnalysis analysis = analyse_image(model, image_path, settings);
      write_export(model, analysis, settings);
    });

  // The attention alone, on layer 0's q, k, v, as forward() calls it.
  const VitConfig& cfg = model.config;
  const int n = result.tokens, heads = cfg.num_heads, hd = cfg.head_dim(), dim = cfg.embed_dim;
  const MatRM& qkv = result.layers[0].qkv;
  MatRM context(n, dim), column_sums(heads, n), first_rows(heads, n);
  std::vector<uint8_t> counts(static_cast<size_t>(n), 1);
  AttentionInputs in;
  in.tokens = n, in.heads = heads, in.head_dim = hd;
  in.queries = qkv.data(), in.keys = qkv.data() + dim, in.values = qkv.data() + 2 * dim;
  in.query_stride = in.key_stride = in.value_stride = 3 * dim;
  in.scale = result.score_scale;
  in.mask = &result.mask;
  in.counts_as_query = counts.data();
  AttentionOutputs out;
  out.context = context.data(), out.context_stride = dim;
  out.column_sums = column_sums.data();
  out.first_rows = first_rows.data();
  r["attention_ms"] = time_runs(args.runs, [&](int) {
    if (result.precision == Precision::Bf16) multi_head_attention_bf16(in, out, args.threads);  // the forward's
    else multi_head_attention(in, out, args.threads);
  });
  r["peak_rss_mib"] = peak_rss_mib();

  if (n <= args.reference_max_tokens) {
    r["reference_attention_ms"] = time_runs(args.runs, [&](int) {
      for (int h = 0; h < heads; ++h) {
        const MatRM q = qkv.middleCols(h * hd, hd), k = qkv.middleCols(dim + h * hd, hd),
                    v = qkv.middleCols(2 * dim + h * hd, hd);
        const AttentionResult ref = scaled_dot_product_attention(q, k, v, result.mask, result.score_scale);
        context.middleCols(h * hd, hd) = ref.context;
        column_sums.row(h) = ref.weights.colwise().sum() / static_cast<float>(n);
      }
    });
  }
  std::filesystem::remove_all(dir);
  return r;
}

// [SECTION] A deep model: ViT-B/16 at 224 px, 197 tokens, 12 layers x 12 heads

// A /16 ViT of width `dim` with 12 layers of 12 heads at 224 px, random weights (seeded), and a
// random 224 x 224 image prepared for it.
struct Vit224 {
  VitModel model;
  PreparedImage prepared;
};

Vit224 vit_224(const std::string& name, int dim, unsigned seed, const std::string& what) {
  VitConfig c;
  c.name = name;
  c.patch_size = 16, c.embed_dim = dim, c.num_heads = 12, c.depth = 12;
  c.img_h = c.img_w = 224;
  Vit224 vit{model_from_tensors(c, gaussian_tensors(c, seed, 0.05f), what), {}};
  cv::Mat pixels(224, 224, CV_8UC3);
  cv::randu(pixels, 0, 256);
  cv::Mat rgb01;
  pixels.convertTo(rgb01, CV_32FC3, 1.0 / 255.0);
  vit.prepared = prepare_image(rgb01, c, 0);
  return vit;
}

// The record of a Vit224 ("model") with its forward time ("forward_ms") and token count;
// `result` is the last forward's.
json forward_record(const Vit224& vit, const BenchArgs& args, const ForwardOptions& options, ForwardResult& result) {
  json r;
  r["model"] = {{"patch_size", 16}, {"embed_dim", vit.model.config.embed_dim}, {"num_heads", 12}, {"depth", 12}, {"image", 224}};
  r["forward_ms"] = time_runs(args.runs, [&](int) { result = forward(vit.model, vit.prepared.grid, options); });
  r["tokens"] = result.tokens;
  return r;
}

json bench_deep(const BenchArgs& args) {
  const Vit224 vit = vit_224("vit-b16-shape", 768, 4321, "bench deep model");
  const VitConfig& c = vit.model.config;
  const VitModel& model = vit.model;
  const PreparedImage& prepared = vit.prepared;
  ForwardOptions options;
  options.threads = args.threads;
  options.precision = args.precision;
  ForwardResult result;
  json r = forward_record(vit, args, options, result);
  // Every head of every layer for one query: what a layers x heads grid redraws when the query moves.
  const RunPolicy many{std::max(args.runs.max_runs, 21), std::max(args.runs.min_runs, 21), args.runs.budget_s};
  MapRequest request;
  request.mode = MapMode::Query;
  r["all_layers_query_maps_ms"] = time_runs(many, [&](int run) {
    request.query_token = 1 + static_cast<int>((static_cast<int64_t>(run) * 37) % (result.tokens - 1));
    for (int l = 0; l < c.depth; ++l) {
      request.layer = l;
      const HeadMaps maps = attention_maps(model, result, request);
      if (maps.heads.size() != 12) throw Error("attention_maps gave no maps");
    }
  });
  options.keep_probs = true;
  ForwardResult full = forward(model, prepared.grid, options);
  r["forward_keep_probs_ms"] = time_runs(args.runs, [&](int) { full = forward(model, prepared.grid, options); });
  RolloutOptions rollout;
  rollout.discard_ratio = 0.9f;
  r["rollout_ms"] = time_runs(args.runs, [&](int) {
    const MatRM m = attention_rollout(full, rollout);
    if (m.rows() != result.tokens) throw Error("rollout size");
  });
  return r;
}

// [SECTION] The layers x heads grid: ViT-S/16 shape, 224 px, 197 tokens, 12 x 12 heads

// What the viewer's Layers x heads window does when the query moves: all_layer_maps (144 rows
// from the cached q and key panels) and layer_grid (those maps scaled and coloured into one
// picture, with and without the threshold), against the forward pass in the same run.
json bench_grid(const BenchArgs& args) {
  const Vit224 vit = vit_224("vit-s16-shape", 384, 2468, "bench grid model");
  const VitModel& model = vit.model;
  ForwardOptions options;
  options.threads = args.threads;
  options.precision = args.precision;
  ForwardResult result;
  json r = forward_record(vit, args, options, result);
  const RunPolicy many{std::max(args.runs.max_runs, 51), std::max(args.runs.min_runs, 51), args.runs.budget_s};
  // A different query each run, spread over the image (and the class token), as a moving mouse.
  auto query = [&](int run) { return static_cast<int>((static_cast<int64_t>(run) * 37) % result.tokens); };
  r["all_layer_maps_ms"] = time_runs(many, [&](int run) {
    const std::vector<HeadMaps> maps = all_layer_maps(model, result, MapMode::Query, query(run));
    if (maps.size() != 12 || maps.back().heads.size() != 12) throw Error("all_layer_maps gave no maps");
  });
  LayerGridStyle style;  // robust scale, viridis, as the viewer's defaults
  r["layer_grid_ms"] = time_runs(many, [&](int run) {
    const LayerGrid g = layer_grid(model, result, MapMode::Query, query(run), style);
    if (g.picture.empty()) throw Error("layer_grid drew nothing");
  });
  style.threshold = 0.6f;
  r["layer_grid_threshold_ms"] = time_runs(many, [&](int run) {
    const LayerGrid g = layer_grid(model, result, MapMode::Query, query(run), style);
    if (g.picture.empty()) throw Error("layer_grid drew nothing");
  });
  return r;
}

// Runs bench_size in a forked child and returns its JSON (or {"image", "error"}).
json bench_size_in_child(const BenchArgs& args, int img) {
  int fds[2];
  if (pipe(fds) != 0) throw Error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw Error("fork failed");
  if (pid == 0) {
    close(fds[0]);
    std::string text;
    int code = 0;
    try {
      text = bench_size(args, img).dump();
    } catch (const std::exception& e) {
      text = json{{"image", img}, {"error", e.what()}}.dump();
      code = 1;
    }
    for (size_t done = 0; done < text.size();) {
      const ssize_t w = write(fds[1], text.data() + done, text.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t got; (got = read(fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (text.empty())
    return {{"image", img},
            {"error", "the child process died (signal " + std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : 0) + ")"}};
  return json::parse(text);
}

// [SECTION] Output

std::string cell(const json& r, const char* key) {
  if (!r.contains(key)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", r[key]["median"].get<double>());
  return text;
}

void print_table(const json& report) {
  const json& m = report["model"];
  const int depth = m["depth"].get<int>();
  std::printf("vitlens_bench: P=%d D=%d H=%d d=%d, %d %s; kernels %s, %d threads; %s\n", m["patch_size"].get<int>(),
              m["embed_dim"].get<int>(), m["num_heads"].get<int>(), m["head_dim"].get<int>(), depth,
              depth == 1 ? "block" : "blocks",
              report["isa"].get<std::string>().c_str(), report["threads"].get<int>(),
              report["cpu"].get<std::string>().c_str());
  std::printf("cpu features: %s\n", report["cpu_features"].get<std::string>().c_str());
  std::printf("medians in ms; reference = the plain scaled_dot_product_attention on the same q, k, v; "
              "load average %.2f before, %.2f after\n\n",
              report["load_average_before"].get<double>(), report["load_average_after"].get<double>());
  if (report.contains("limits")) {
    const json& lim = report["limits"];
    std::printf("limits, one core: FMA %.1f GFLOP/s, exp %.2f per ns; all %d threads at once: FMA %.1f GFLOP/s, exp "
                "%.2f per ns; GEMM 512^3 %.1f GFLOP/s (%.0f %% of FMA), %.1f GFLOP/s on all threads\n",
                lim["fma_gflops_per_core"].get<double>(), lim["exp_per_ns_per_core"].get<double>(),
                report["threads"].get<int>(), lim["fma_gflops_all_threads"].get<double>(),
                lim["exp_per_ns_all_threads"].get<double>(),
                lim["gemm_512_gflops_1_thread"].get<double>(), 100.0 * lim["gemm_fraction_of_fma_peak"].get<double>(),
                lim["gemm_512_gflops_all_threads"].get<double>());
    std::printf("%s\n\n", lim["floors"].get<std::string>().c_str());
  }
  std::printf("%6s %7s %11s %13s %13s %8s %13s %10s %13s %10s %10s\n", "image", "tokens", "forward", "attention",
              "reference", "speedup", "query map", "export", "peak RSS MiB", "fwd/floor", "attn/floor");
  for (const json& r : report["sizes"]) {
    if (r.contains("error")) {
      std::printf("%6d  error: %s\n", r["image"].get<int>(), r["error"].get<std::string>().c_str());
      continue;
    }
    std::string speedup = "-";
    if (r.contains("reference_attention_ms")) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1fx",
                    r["reference_attention_ms"]["median"].get<double>() / r["attention_ms"]["median"].get<double>());
      speedup = text;
    }
    auto percent = [&](const char* key) {
      if (!r.contains(key)) return std::string("-");
      char text[32];
      std::snprintf(text, sizeof text, "%.0f %%", 100.0 * r[key].get<double>());
      return std::string(text);
    };
    std::printf("%6d %7d %11s %13s %13s %8s %13s %10s %13.0f %10s %10s\n", r["image"].get<int>(), r["tokens"].get<int>(),
                cell(r, "forward_ms").c_str(), cell(r, "attention_ms").c_str(),
                cell(r, "reference_attention_ms").c_str(), speedup.c_str(), cell(r, "query_map_ms").c_str(),
                cell(r, "export_ms").c_str(), r["peak_rss_mib"].get<double>(),
                percent("forward_fraction_of_floor").c_str(), percent("attention_fraction_of_floor").c_str());
  }
}

// [SECTION] Main

void add_options(CLI::App& app, BenchArgs& args) {
  app.add_option("--size", args.sizes, "image sizes in pixels (square; multiples of 4)")->check(CLI::Range(4, 4096));
  app.add_flag("--json", args.json_output, "print one JSON object instead of the table");
  app.add_option("--isa", args.isa, "kernels: auto (VITLENS_ISA's, else the best this CPU runs), portable, avx2 or avx512")
      ->check(CLI::IsMember({"auto", "portable", "avx2", "avx512"}));
  app.add_option("--threads", args.threads, "attention threads (0 = one per core)")->check(CLI::Range(0, 256));
  app.add_option("--runs", args.runs.max_runs, "most runs per median")->check(CLI::Range(1, 1000));
  app.add_option("--min-runs", args.runs.min_runs, "fewest runs per median")->check(CLI::Range(1, 1000));
  app.add_option("--budget", args.runs.budget_s, "seconds after which a measurement stops adding runs")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--reference-max-tokens", args.reference_max_tokens, "largest size the plain reference runs at");
  app.add_flag("--no-export", args.no_export, "skip the export timing");
  app.add_flag("--deep", args.deep,
               "instead: a ViT-B/16-shaped model (D 768, 12 heads, 12 layers) at 224 px: forward, every layer's "
               "query maps (144 heads), rollout");
  app.add_flag("--grid", args.grid,
               "instead: the viewer's layers x heads grid on a ViT-S/16-shaped model (D 384, 12 heads, 12 layers) at "
               "224 px: forward, every layer's query maps (144 heads), the grid picture");
  app.add_option("--model", args.model_path,
                 "a vitlens .safetensors model to time instead of the default shape with random weights "
                 "(the image is resized to each --size; bench/compare_peers.py passes the peers' weights)");
  app.add_flag("--no-limits", args.no_limits, "skip measuring the machine's limits (FMA, exp, GEMM)");
  app.add_option("--watch", args.watch_s,
                 "instead: for this many seconds, every half second one core's FMA rate, exp rate and 512^3 GEMM "
                 "(a shared machine's slow spells show as dips in all three)")
      ->check(CLI::Range(0.5, 3600.0))
      ->excludes("--json")
      ->excludes("--deep")
      ->excludes("--grid")
      ->excludes("--size")
      ->excludes("--model")
      ->excludes("--threads");
  app.add_option("--precision", args.precision_text, "the forward's products (Linear layers, attention): fp32, bf16 or auto (vit.hpp Precision)")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}));
}

// Prints R's medians of KEYS, one a line (for --grid and --deep).
void print_medians(const json& r, std::initializer_list<const char*> keys) {
  for (const char* key : keys)
    std::printf("  %-26s %8.3f (min %.3f, %d runs)\n", key, r[key]["median"].get<double>(), r[key]["min"].get<double>(),
                r[key]["runs"].get<int>());
}

void print_grid(const json& r) {
  std::printf("ViT-S/16 shape, 224 px, %d tokens, %s kernels, load %.2f (medians in ms)\n", r["tokens"].get<int>(),
              kernel_isa_name(kernel_isa()), load_average());
  print_medians(r, {"forward_ms", "all_layer_maps_ms", "layer_grid_ms", "layer_grid_threshold_ms"});
  std::printf("  layer_grid / forward       %8.2e\n",
              r["layer_grid_ms"]["median"].get<double>() / r["forward_ms"]["median"].get<double>());
}

void print_deep(const json& r, Precision precision) {
  std::printf("ViT-B/16 shape, 224 px, %d tokens, %s kernels, precision %s, load %.2f (medians in ms)\n",
              r["tokens"].get<int>(), kernel_isa_name(kernel_isa()), precision_name(precision), load_average());
  print_medians(r, {"forward_ms", "all_layers_query_maps_ms", "forward_keep_probs_ms", "rollout_ms"});
}

// The report's header: what ran, on what, the load, and (unless --no-limits) the machine's limits.
json report_header(const BenchArgs& args, bool freed_memory_kept) {
  json report;
  report["bench"] = "vitlens_bench";
  report["version"] = VITLENS_VERSION;
  report["model"] = {{"patch_size", 4}, {"embed_dim", 48}, {"num_heads", 4}, {"head_dim", 12}, {"depth", 1}};
  report["isa"] = kernel_isa_name(kernel_isa());
  report["precision"] = precision_name(args.precision);
  report["bf16_kernel"] = bf16_kernel_name(bf16_kernel());
  report["threads"] = args.threads > 0 ? args.threads : static_cast<int>(std::thread::hardware_concurrency());
  report["cpu"] = cpu_name();
  report["cpu_features"] = cpu_features_line();  // avx512-bf16 and amx-bf16 too
  report["freed_memory_kept"] = freed_memory_kept;
  report["load_average_before"] = load_average();
  if (!args.no_limits) {
    const bench::MachineLimits lim = bench::measure_limits(args.threads);
    report["limits"] = {{"fma_gflops_per_core", lim.fma_gflops},
                        {"exp_per_ns_per_core", lim.exp_per_ns},
                        {"fma_gflops_all_threads", lim.fma_gflops_all},
                        {"exp_per_ns_all_threads", lim.exp_per_ns_all},
                        {"gemm_512_gflops_1_thread", lim.gemm_gflops_1t},
                        {"gemm_512_gflops_all_threads", lim.gemm_gflops_nt},
                        {"gemm_fraction_of_fma_peak", lim.gemm_gflops_1t / lim.fma_gflops},
                        {"avx512_bf16_gflops_per_core", lim.bf16_dot_note.empty() ? json(lim.bf16_dot_gflops)
                                                                                  : json(lim.bf16_dot_note)},
                        {"amx_bf16_gflops_per_core", lim.amx_note.empty() ? json(lim.amx_gflops) : json(lim.amx_note)},
                        {"floors", bench::floors_line(lim)}};
  }
  return report;
}

// Each size's floors in ms at the measured limits, all threads busy at once; fraction = floor / median.
void add_floors(json& report) {
  const json& lim = report["limits"];
  // The products' rate: the bfloat16 dot product's for a bf16 forward where the CPU has one (its
  // Linear layers and attention products are bfloat16), else float32 FMA's.
  // The unit the bf16 products run on, when the run measured its rate: AMX's tiles or AVX512-BF16.
  const char* bf16_rate_key = report["bf16_kernel"] == "amx"          ? "amx_bf16_gflops_per_core"
                              : report["bf16_kernel"] == "avx512bf16" ? "avx512_bf16_gflops_per_core"
                                                                      : nullptr;
  const bool bf16_unit = report["precision"] == "bf16" && bf16_rate_key && lim[bf16_rate_key].is_number();
  // Rates with every thread busy at once, as measured (on a VM whose virtual cores share physical
  // ones, less than threads x one core's); the bf16 unit's is one core's scaled as FMA's scaled.
  const double fma_all = lim["fma_gflops_all_threads"].get<double>();
  const double parallel = fma_all / lim["fma_gflops_per_core"].get<double>();
  const double fma = bf16_unit ? lim[bf16_rate_key].get<double>() * parallel : fma_all;
  report["floor_rate"] = !bf16_unit ? "float32 fma"
                         : report["bf16_kernel"] == "amx" ? "amx-bf16 tiles"
                                                          : "avx512-bf16 dot products";
  const double exps = lim["exp_per_ns_all_threads"].get<double>();
  for (json& r : report["sizes"]) {
    if (r.contains("error")) continue;
    const double attention_floor = r["attention_gflop"].get<double>() / fma * 1e3 + r["attention_gexps"].get<double>() / exps * 1e3;
    const double forward_floor =
        r["model"]["depth"].get<double>() * attention_floor + r["linear_gflop"].get<double>() / fma * 1e3;
    r["attention_floor_ms"] = attention_floor;
    r["forward_floor_ms"] = forward_floor;
    r["attention_fraction_of_floor"] = attention_floor / r["attention_ms"]["median"].get<double>();
    r["forward_fraction_of_floor"] = forward_floor / r["forward_ms"]["median"].get<double>();
  }
}

// Times every --size (each in a child process) and prints the table or the JSON; 1 if a size failed.
int bench_sizes(const BenchArgs& args, bool freed_memory_kept) {
  json report = report_header(args, freed_memory_kept);
  report["sizes"] = json::array();
  bool failed = false;
  for (int s : args.sizes) {
    json r = bench_size_in_child(args, s);
    failed = failed || r.contains("error");
    report["sizes"].push_back(std::move(r));
    if (!args.json_output) std::fprintf(stderr, "vitlens_bench: %d px done\n", s);
  }
  report["load_average_after"] = load_average();
  for (const json& r : report["sizes"])  // the model the sizes timed (--model's, or the default shape's)
    if (r.contains("model")) {
      report["model"] = r["model"];
      break;
    }
  if (report.contains("limits")) add_floors(report);
  if (args.json_output) std::cout << report.dump(2) << std::endl;
  else print_table(report);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As the vitlens executable does (app/main.cpp): repeated forwards reuse the pages they freed.
  const bool freed_memory_kept = keep_freed_memory();
  BenchArgs args;
  CLI::App app{"vitlens_bench: timings of vitlens' attention for the default model shape (P=4, D=48, H=4), or for "
               "--model's"};
  add_options(app, args);
  CLI11_PARSE(app, argc, argv);
  parse_precision(args.precision_text, args.precision);
  args.runs.min_runs = std::min(args.runs.min_runs, args.runs.max_runs);
  for (int s : args.sizes)
    if (s % 4 != 0) {
      std::cerr << "vitlens_bench: --size " << s << " is not a multiple of the patch size 4\n";
      return 2;
    }

  try {
    KernelIsa isa;
    if (parse_kernel_isa(args.isa, isa)) set_kernel_isa(isa);  // "auto": VITLENS_ISA's, or the widest
  } catch (const Error& e) {
    std::cerr << "vitlens_bench: " << e.what() << "\n";
    return 2;
  }
  if (args.watch_s > 0.0) {
    bench::watch_limits(args.watch_s, 0.5);
    return 0;
  }
  if (args.grid) {
    const json r = bench_grid(args);
    if (args.json_output) std::cout << r.dump(2) << std::endl;
    else print_grid(r);
    return 0;
  }
  if (args.deep) {
    const json r = bench_deep(args);
    if (args.json_output) std::cout << r.dump(2) << std::endl;
    else print_deep(r, args.precision);
    return 0;
  }
  return bench_sizes(args, freed_memory_kept);
}
