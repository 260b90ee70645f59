// vitlens_dnnl_bench: vitlens' Linear-layer products against oneDNN's matmul (Debian's libdnnl-dev)
// on one transformer block's four products (qkv, proj, fc1, fc2) of a ViT shape, float32 and
// bfloat16, the same random operands, interleaved in one run. The question it answers: should the
// products run on oneDNN instead of vitlens' own packed SGEMM and bfloat16 tiles (core/cpu/gemm*.cpp)?
//
// Both sides are timed as a forward runs them: the weights prepared once (vitlens: pack_linear /
// pack_linear_bf16; oneDNN: reordered into the layout its matmul asks for), then Y = X W^T + b
// from float32 X into float32 Y (bfloat16: X rounded inside the timed call, as vitlens' forward
// does, by a oneDNN reorder for oneDNN). Before timing, each pair of results is checked against
// the other within twice the float32 accumulation bound (2 K 2^-24 sum_k |x w|, on the bfloat16
// operands for bf16): a comparison of two different products would say nothing.
//
// Shapes (M = tokens, K -> N): vit_s16 D 384, 197 tokens; vit_b16 D 768, 197; vit_s8 D 384, 3601
// (480 px); --tokens overrides M. oneDNN runs on its OpenMP threads, with OMP_WAIT_POLICY=passive
// unless the environment sets a policy, so its idle threads do not spin while vitlens runs (libgomp
// reads the variable as it loads, before main: the program sets it and runs itself again).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/cpu/bf16.hpp"
#include "core/cpu/cpu.hpp"
#include "core/cpu/gemm.hpp"

namespace {

using namespace vitlens;
using Clock = std::chrono::steady_clock;

struct Product {
  const char* name;
  int k, n;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Median seconds of `runs` calls (one untimed call first).
double time_median(int runs, const std::function<void()>& call) {
  call();
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    call();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

// One product on both libraries, one precision: operands, prepared weights, primitives.
struct Pair {
  std::string name;
  int m, k, n;
  bool bf16;
  std::vector<float> x, w, b, y_vitlens, y_dnnl;
  PackedLinear packed;
  PackedLinearBf16 packed_bf16;
  dnnl::matmul matmul;
  dnnl::memory x_f32, x_dnnl, w_dnnl, b_dnnl, y_mem;
  dnnl::reorder x_round;  // bf16: X to bfloat16 inside the timed call
  std::string impl;       // oneDNN's implementation ("" when it has no matmul for the pair)
  std::string skip;       // why oneDNN is not timed
  double worst = 0.0;     // worst_over_bound
};

void run_vitlens(Pair& p, int threads) {
  if (p.bf16)
    linear_forward_bf16(p.x.data(), p.k, p.m, p.packed_bf16, p.b.data(), p.y_vitlens.data(), p.n,
                        LinearEpilogue::Store, threads);
  else
    linear_forward_packed(p.x.data(), p.k, p.m, p.packed, p.b.data(), p.y_vitlens.data(), p.n, LinearEpilogue::Store,
                          threads);
}

void run_dnnl(Pair& p, dnnl::stream& stream) {
  if (p.bf16) p.x_round.execute(stream, p.x_f32, p.x_dnnl);
  p.matmul.execute(stream, {{DNNL_ARG_SRC, p.x_dnnl}, {DNNL_ARG_WEIGHTS, p.w_dnnl}, {DNNL_ARG_BIAS, p.b_dnnl},
                            {DNNL_ARG_DST, p.y_mem}});
  stream.wait();
}

void setup(Pair& p, dnnl::engine& engine, dnnl::stream& stream, std::mt19937& rng) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x.resize(static_cast<size_t>(p.m) * p.k), p.w.resize(static_cast<size_t>(p.n) * p.k), p.b.resize(p.n);
  for (float& v : p.x) v = normal(rng);
  for (float& v : p.w) v = normal(rng) / std::sqrt(static_cast<float>(p.k));
  for (float& v : p.b) v = 0.1f * normal(rng);
  p.y_vitlens.assign(static_cast<size_t>(p.m) * p.n, 0.0f);
  p.y_dnnl.assign(p.y_vitlens.size(), 0.0f);
  if (p.bf16) pack_linear_bf16(p.w.data(), p.n, p.k, p.packed_bf16);
  else pack_linear(p.w.data(), p.n, p.k, p.packed);

  const dt in_type = p.bf16 ? dt::bf16 : dt::f32;
  const dnnl::memory::desc x_desc({p.m, p.k}, in_type, tag::ab), w_any({p.k, p.n}, in_type, tag::any),
      b_desc({1, p.n}, dt::f32, tag::ab), y_desc({p.m, p.n}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(x_desc, w_any, b_desc, y_desc), engine);
  } catch (const dnnl::error& e) {
    p.skip = std::string("oneDNN has no matmul for it here (") + e.what() + ")";
    return;
  }
  p.impl = pd.impl_info_str();
  if (p.impl.rfind("ref", 0) == 0 || p.impl.find("gemm:ref") != std::string::npos) {
    p.skip = "oneDNN's only matmul for it on this CPU is its reference loop (" + p.impl + ")";
    return;
  }
  p.matmul = dnnl::matmul(pd);
  // W (N, K) row-major is W^T (K, N) in layout ba; reordered once into the primitive's layout.
  p.x_f32 = dnnl::memory({{p.m, p.k}, dt::f32, tag::ab}, engine, p.x.data());
  dnnl::memory w_user({{p.k, p.n}, dt::f32, tag::ba}, engine, p.w.data());
  p.w_dnnl = dnnl::memory(pd.weights_desc(), engine);
  dnnl::reorder(w_user, p.w_dnnl).execute(stream, w_user, p.w_dnnl);
  p.b_dnnl = dnnl::memory(b_desc, engine, p.b.data());
  p.y_mem = dnnl::memory(y_desc, engine, p.y_dnnl.data());
  if (p.bf16) {
    p.x_dnnl = dnnl::memory(pd.src_desc(), engine);
    p.x_round = dnnl::reorder(p.x_f32, p.x_dnnl);
  } else {
    p.x_dnnl = p.x_f32;
  }
  stream.wait();
}

// The worst |vitlens - oneDNN| over the bound 2 K 2^-24 sum_k |x w| (on the rounded operands for
// bf16), plus 1e-30; above 1 the two did not compute the same product.
double worst_over_bound(const Pair& p) {
  std::vector<float> ax(p.x.size()), aw(p.w.size()), scale(p.y_vitlens.size());
  for (size_t i = 0; i < ax.size(); ++i) ax[i] = std::fabs(p.bf16 ? round_to_bf16(p.x[i]) : p.x[i]);
  for (size_t i = 0; i < aw.size(); ++i) aw[i] = std::fabs(p.bf16 ? round_to_bf16(p.w[i]) : p.w[i]);
  linear_forward(ax.data(), p.k, p.m, p.k, aw.data(), p.n, nullptr, scale.data(), p.n);
  double worst = 0.0;
  for (size_t i = 0; i < scale.size(); ++i) {
    const double bound = 2.0 * p.k * std::ldexp(1.0, -24) * (scale[i] + std::fabs(p.b[i % p.n])) + 1e-30;
    worst = std::max(worst, std::fabs(static_cast<double>(p.y_vitlens[i]) - p.y_dnnl[i]) / bound);
  }
  return worst;
}

// Builds the pairs, checks them, times them and prints the table; 1 when the results disagree.
int compare(const std::string& arch, const std::string& precision, int tokens, int threads, int runs, int rounds,
            const char* policy) {
  omp_set_num_threads(threads);
  const int dim = arch == "vit_b16" ? 768 : 384;
  const int m = tokens > 0 ? tokens : arch == "vit_s8" ? 3601 : 197;
  const Product products[] = {{"qkv", dim, 3 * dim}, {"proj", dim, dim}, {"fc1", dim, 4 * dim}, {"fc2", 4 * dim, dim}};

  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::mt19937 rng(7);
  std::vector<Pair> pairs;
  for (const bool bf16 : {false, true}) {
    if ((bf16 && precision == "fp32") || (!bf16 && precision == "bf16")) continue;
    for (const Product& pr : products) {
      Pair p;
      p.name = pr.name, p.m = m, p.k = pr.k, p.n = pr.n, p.bf16 = bf16;
      pairs.push_back(std::move(p));
    }
  }
  const dnnl::version_t* v = dnnl_version();
  std::printf("%s, model width %d, %d tokens, %d thread(s); vitlens kernels %s, bf16 %s; oneDNN %d.%d.%d, "
              "OMP_WAIT_POLICY %s\n",
              arch.c_str(), dim, m, threads, kernel_isa_name(kernel_isa()), bf16_kernel_name(bf16_kernel()), v->major,
              v->minor, v->patch, policy);
  for (Pair& p : pairs) {
    setup(p, engine, stream, rng);
    run_vitlens(p, threads);
    if (!p.skip.empty()) continue;
    run_dnnl(p, stream);
    p.worst = worst_over_bound(p);
    if (!(p.worst <= 1.0)) {
      std::fprintf(stderr, "vitlens_dnnl_bench: %s %s: vitlens and oneDNN differ by %.3g times the bound\n",
                   p.bf16 ? "bf16" : "fp32", p.name.c_str(), p.worst);
      return 1;
    }
  }

  // ms[pair][round] for each library; every product on both, in turn, each round.
  std::vector<std::vector<double>> ms_v(pairs.size()), ms_d(pairs.size());
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < pairs.size(); ++i) {
      Pair& p = pairs[i];
      ms_v[i].push_back(1e3 * time_median(runs, [&] { run_vitlens(p, threads); }));
      if (p.skip.empty()) ms_d[i].push_back(1e3 * time_median(runs, [&] { run_dnnl(p, stream); }));
    }

  for (const bool bf16 : {false, true}) {
    double worst = 0.0;
    int compared = 0, count = 0;
    for (const Pair& p : pairs)
      if (p.bf16 == bf16) {
        ++count;
        if (p.skip.empty()) ++compared, worst = std::max(worst, p.worst);
      }
    if (count == 0) continue;
    if (compared == 0)
      std::printf("not compared (%s): oneDNN ran none of the %d products (why: below)\n", bf16 ? "bf16" : "fp32",
                  count);
    else
      std::printf("results agree (%s, %d of %d products): worst |vitlens - oneDNN| = %.2g of the bound 2 K 2^-24 "
                  "sum |x w|\n",
                  bf16 ? "bf16" : "fp32", compared, count, worst);
  }
  std::printf("medians over %d rounds of %d calls; ratio = oneDNN time / vitlens time (above 1: vitlens faster)\n",
              rounds, runs);
  std::printf("%-5s %-5s %6s %6s %6s %11s %9s %11s %9s %8s  %s\n", "prec", "op", "M", "K", "N", "vitlens ms", "GFLOP/s",
              "oneDNN ms", "GFLOP/s", "ratio", "oneDNN implementation");
  for (const bool bf16 : {false, true}) {
    double sum_v = 0.0, sum_d = 0.0, flops = 0.0;
    bool any = false, all_dnnl = true;
    std::vector<double> round_ratio(static_cast<size_t>(rounds), 0.0), round_v(round_ratio), round_d(round_ratio);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const Pair& p = pairs[i];
      if (p.bf16 != bf16) continue;
      any = true;
      const double f = 2.0 * p.m * p.k * p.n, tv = median(ms_v[i]);
      flops += f, sum_v += tv;
      for (int r = 0; r < rounds; ++r) round_v[static_cast<size_t>(r)] += ms_v[i][static_cast<size_t>(r)];
      std::printf("%-5s %-5s %6d %6d %6d %11.3f %9.1f", bf16 ? "bf16" : "fp32", p.name.c_str(), p.m, p.k, p.n, tv,
                  f / tv * 1e-6);
      if (!p.skip.empty()) {
        all_dnnl = false;
        std::printf("  not timed: %s\n", p.skip.c_str());
        continue;
      }
      const double td = median(ms_d[i]);
      sum_d += td;
      for (int r = 0; r < rounds; ++r) round_d[static_cast<size_t>(r)] += ms_d[i][static_cast<size_t>(r)];
      std::printf(" %11.3f %9.1f %7.2fx  %s\n", td, f / td * 1e-6, td / tv, p.impl.c_str());
    }
    if (!any) continue;
    std::printf("%-5s %-5s %6s %6s %6s %11.3f %9.1f", bf16 ? "bf16" : "fp32", "all4", "", "", "", sum_v,
                flops / sum_v * 1e-6);
    if (!all_dnnl) {
      std::printf("\n");
      continue;
    }
    for (int r = 0; r < rounds; ++r) round_ratio[static_cast<size_t>(r)] = round_d[r] / round_v[r];
    const auto [lo, hi] = std::minmax_element(round_ratio.begin(), round_ratio.end());
    std::printf(" %11.3f %9.1f %7.2fx  median of the rounds' ratios %.2fx (range %.2f to %.2f)\n", sum_d,
                flops / sum_d * 1e-6, sum_d / sum_v, median(round_ratio), *lo, *hi);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (policy && !*policy) policy = "empty: libgomp's default";
  if (!policy) {  // once: the same program, with the variable libgomp reads at load time
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    std::fprintf(stderr, "vitlens_dnnl_bench: could not run itself again with OMP_WAIT_POLICY=passive; oneDNN's "
                         "idle threads keep libgomp's default policy\n");
    policy = "libgomp's default";
  }
  CLI::App app{"vitlens_dnnl_bench: vitlens' Linear products against oneDNN's matmul, one block of a ViT shape"};
  std::string arch = "vit_b16", precision = "both";
  int tokens = 0, threads = 1, runs = 5, rounds = 5;
  app.add_option("--arch", arch, "vit_s16 (D 384, 197 tokens), vit_b16 (D 768, 197) or vit_s8 (D 384, 3601)")
      ->check(CLI::IsMember({"vit_s16", "vit_b16", "vit_s8"}))
      ->capture_default_str();
  app.add_option("--tokens", tokens,
                 "rows M instead of the shape's token count (0: the shape's); all eight products' operands are "
                 "held at once: about 2.7 GB for vit_b16 at the largest M")
      ->check(CLI::Range(0, 16385))
      ->capture_default_str();
  app.add_option("--threads", threads, "threads for both libraries")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--runs", runs, "calls per median")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--rounds", rounds, "rounds, each timing every product on both libraries in turn")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--precision", precision, "fp32, bf16 or both")
      ->check(CLI::IsMember({"fp32", "bf16", "both"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return compare(arch, precision, tokens, threads, runs, rounds, policy);
  } catch (const std::exception& e) {  // oneDNN's errors, out of memory
    std::fprintf(stderr, "vitlens_dnnl_bench: %s\n", e.what());
    return 1;
  }
}
