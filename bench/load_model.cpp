// vitlens_load_bench: how long opening a model file takes, the file read into its tensors
// (read_safetensors) and the whole load (load_model: the tensors checked and laid out as the
// model), medians over runs. The file is read from the page cache after the first run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/base/error.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vitlens_load_bench: medians of read_safetensors and load_model on one model file"};
  std::string path;
  int runs = 5;
  app.add_option("model", path, "a .safetensors model file")->required();
  app.add_option("--runs", runs, "runs of each (after one warm-up read)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    (void)vitlens::read_safetensors(path);  // the page cache holds the file from here on
    std::vector<double> read_ms, load_ms;
    for (int r = 0; r < runs; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      { const vitlens::SafetensorsFile file = vitlens::read_safetensors(path); }
      read_ms.push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
      { const vitlens::VitModel model = vitlens::load_model(path); }
      load_ms.push_back(ms_since(t0));
    }
    std::printf("%s: read_safetensors %.0f ms, load_model %.0f ms (medians of %d runs; each run: %s)\n", path.c_str(),
                median(read_ms), median(load_ms), runs, [&] {
                  std::string all;
                  for (size_t i = 0; i < read_ms.size(); ++i)
                    all += (i ? ", " : "") + std::to_string(static_cast<int>(read_ms[i])) + "/" +
                           std::to_string(static_cast<int>(load_ms[i]));
                  return all;
                }().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vitlens_load_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
