// Masked-autoencoder pretraining: the gradients against PyTorch autograd and finite
// differences, a short run that learns, bit-exact resume, checkpoints that open as ordinary models
// (the decoder kept out of the model file on purpose), and one clear line for bad input.
//
// PyTorch: tests/fixtures/make_mae_fixtures.py writes an MAE after models_mae.py in float64 (depth 2,
// 16 x 16 image, 4 of 16 patches visible, decoder depth 2) with FIXED kept patches, so this file
// runs the identical mask. Each gradient is compared in the max norm:
//   rel = max_i |g_i - ref_i| / max_i |ref_i|   must be <= 1e-4 (the largest is printed).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "process_support.hpp"
#include "test_support.hpp"
#include "training/train_panel.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "core/train/mae_objective.hpp"
#include "core/train/mae_train.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"
#include "core/train/train_ops.hpp"

using namespace vitlens;

namespace {

const std::string kMaeFixture = std::string(VITLENS_TEST_FIXTURES) + "/train/grad_mae.safetensors";

using test::max_norm_rel;

void check_mae_fixture(KernelIsa isa) {
  const test::UseIsa use(isa);
  const SafetensorsFile file = read_safetensors(kMaeFixture);
  const VitConfig config = config_from_json(nlohmann::json::parse(file.metadata.at("config")), "grad_mae");
  const train::MaeShape shape = train::MaeShape::from_json(nlohmann::json::parse(file.metadata.at("mae")));
  const int batch = std::stoi(file.metadata.at("batch"));
  train::MaeNet<float> net(config, shape);
  net.threads = 2;
  for (const train::ParamEntry& e : net.layout().entries) {
    INFO("fixture tensor " << e.name);
    REQUIRE(file.tensors.count(e.name) == 1);
    const TensorData& t = file.tensors.at(e.name);
    REQUIRE(t.values.size() == e.size);
    std::copy(t.values.begin(), t.values.end(), net.params.begin() + static_cast<std::ptrdiff_t>(e.offset));
  }
  std::vector<int32_t> keep;
  for (float v : file.tensors.at("keep").values) keep.push_back(static_cast<int32_t>(v));
  REQUIRE(static_cast<int>(keep.size()) == batch * net.visible());

  net.zero_grad();
  const float loss = net.forward(file.tensors.at("input").values.data(), keep.data(), batch);
  net.backward();
  const float ref_loss = file.tensors.at("loss").values[0];
  CHECK(std::abs(loss - ref_loss) <= 1e-5f * std::abs(ref_loss));
  CHECK(max_norm_rel(net.prediction(), file.tensors.at("pred").values) <= 1e-5);

  double worst = 0.0;
  std::string worst_name;
  for (const train::ParamEntry& e : net.layout().entries) {
    const double rel = max_norm_rel(net.grads.data() + e.offset, file.tensors.at("grad." + e.name).values);
    INFO("gradient of " << e.name << " differs by " << rel << " (max-norm relative)");
    CHECK(rel <= 1e-4);
    if (rel > worst) worst = rel, worst_name = e.name;
  }
  std::printf("MAE gradients vs PyTorch (%s ops): loss %.7f (ref %.7f), %zu parameter tensors, largest max-norm relative "
              "difference %.2e (%s)\n",
              train::train_ops_isa(), loss, ref_loss, net.layout().entries.size(), worst, worst_name.c_str());
}

VitConfig tiny_config(int img, int dim, int heads, int depth) {
  VitConfig c = test::vit_config("test-mae", 4, dim, heads, depth, img);
  c.description = "MAE in a test";
  return c;
}

using test::photo_folder;

using Run = test::ShellRun;
using test::count_lines;
using test::slurp;

Run run_vitlens(const std::string& args) {
  static const std::string dir = test::temp_dir("mae-cli");
  return test::run_vitlens_shell(dir, args);
}

}  // namespace

TEST_CASE("mae: every gradient matches PyTorch autograd on the same weights, batch and mask", "[train][mae][grad]") {
  for (KernelIsa isa : test::isas_here()) check_mae_fixture(isa);
}

TEST_CASE("mae: backward agrees with central finite differences in double", "[train][mae][grad]") {
  // D = 8, 2 heads, depth 1, 3 x 3 patches (2 visible), decoder width 4, depth 1, 2 images.
  const VitConfig c = tiny_config(12, 8, 2, 1);
  train::MaeShape shape;
  shape.decoder_dim = 4;
  shape.decoder_heads = 2;
  shape.decoder_depth = 1;
  shape.mask_ratio = 0.7;  // int(9 * 0.3) = 2 visible
  train::MaeNet<double> net(c, shape);
  REQUIRE(net.visible() == 2);
  std::mt19937 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (const train::ParamEntry& e : net.layout().entries) {
    const bool norm_weight = e.name.find("norm") != std::string::npos && e.name.find("weight") != std::string::npos;
    for (size_t i = 0; i < e.size; ++i)
      net.params[e.offset + i] = norm_weight ? 1.0 + 0.2 * normal(rng) : 0.5 * normal(rng);
  }
  const int B = 2;
  std::vector<double> images(static_cast<size_t>(B) * 3 * 12 * 12);
  for (double& v : images) v = normal(rng);
  const std::vector<int32_t> keep = {4, 0, 8, 3};
  net.zero_grad();
  net.forward(images.data(), keep.data(), B);
  net.backward();
  const std::vector<double> analytic = net.grads;
  double worst = 0.0, scale = 0.0;
  const double h = 1e-6;
  for (size_t i = 0; i < net.params.size(); ++i) {
    const double keep_value = net.params[i];
    net.params[i] = keep_value + h;
    const double up = net.forward(images.data(), keep.data(), B);
    net.params[i] = keep_value - h;
    const double down = net.forward(images.data(), keep.data(), B);
    net.params[i] = keep_value;
    worst = std::max(worst, std::abs((up - down) / (2 * h) - analytic[i]));
    scale = std::max(scale, std::abs(analytic[i]));
  }
  std::printf("MAE finite differences (double): %zu parameters, largest |numeric - backward| %.2e (largest gradient %.2e)\n",
              net.params.size(), worst, scale);
  REQUIRE(scale > 1e-3);
  CHECK(worst <= 1e-6 * scale);
  // Hidden-patch-only loss: the mask token and every decoder tensor receive gradient, and a kept
  // index out of range or repeated is refused.
  CHECK(std::abs(net.grad("mask_token")[0]) + std::abs(net.grad("mask_token")[1]) > 0.0);
  const std::vector<int32_t> repeated = {4, 4, 8, 3}, outside = {4, 9, 8, 3};
  CHECK_THROWS_AS(net.forward(images.data(), repeated.data(), B), Error);
  CHECK_THROWS_AS(net.forward(images.data(), outside.data(), B), Error);
}

TEST_CASE("mae: random_keep is MAE's argsort of noise, seeded", "[train][mae]") {
  Rng a(3), b(3);
  std::vector<int32_t> k1(2 * 4), k2(2 * 4);
  train::random_keep(a, 2, 16, 4, k1.data());
  train::random_keep(b, 2, 16, 4, k2.data());
  CHECK(k1 == k2);
  // The same draws by hand: the 4 smallest of 16 uniforms, smallest first.
  Rng c(3);
  for (int img = 0; img < 2; ++img) {
    std::vector<std::pair<double, int>> noise;
    for (int i = 0; i < 16; ++i) noise.emplace_back(c.uniform(), i);
    std::stable_sort(noise.begin(), noise.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (int v = 0; v < 4; ++v) CHECK(k1[static_cast<size_t>(img * 4 + v)] == noise[static_cast<size_t>(v)].second);
  }
}

TEST_CASE("mae: a short run on photos lowers the loss, resume is bit-exact, the checkpoint opens as a model",
          "[train][mae][loop]") {
  const std::string dir = photo_folder("mae-photos");
  FolderReport report;
  const PhotoCorpus all = load_photo_corpus(dir, 96, &report);
  CHECK(all.size() == 6);
  CHECK(report.skipped == 1);  // notes.txt
  CHECK(std::find(all.names.begin(), all.names.end(), "sub/messi5.jpg") != all.names.end());
  PhotoCorpus train_photos, val_photos;
  split_photos(all, 0.2, 1, &train_photos, &val_photos);
  CHECK(train_photos.size() == 5);
  CHECK(val_photos.size() == 1);

  const VitConfig c = tiny_config(16, 16, 2, 1);
  Recipe r;
  r.epochs = 5;
  r.batch = 16;
  r.lr = 5e-3;
  r.warmup_epochs = 0.25;
  r.seed = 4;
  r.threads = 2;
  MaeOptions o;
  o.shape.decoder_dim = 16;
  o.shape.decoder_heads = 2;
  o.crops_per_photo = 64;  // 5 photos x 64 / 16 = 20 steps per epoch
  Trainer full(std::make_unique<MaeObjective>(c, r, o, &train_photos, &val_photos));
  REQUIRE(full.steps_per_epoch() == 20);
  CHECK(r.shards == 4);
  CHECK(full.recipe().shards == 1);  // MAE runs each batch whole, and its checkpoints say so
  const double val_before = full.evaluate().loss;
  CHECK(full.evaluate().loss == val_before);  // fixed crops and masks
  // The first step runs the initial weights: their prediction is close to flat grey, which scores
  // (K - 1) / K = 0.98 on norm-pix targets. The last 10 steps' mean must be clearly below it.
  double first = 0.0, last = 0.0;
  for (int s = 0; s < 100; ++s) {
    const StepReport rep = full.step();
    if (s == 0) first = rep.loss;
    if (s >= 90) last += rep.loss / 10;
  }
  CHECK(full.finished());
  const double val_after = full.evaluate().loss;
  // One held-out photo at 16 px says little about generalisation: its loss is printed, not bounded.
  std::printf("MAE short run: train loss %.4f (first step) -> %.4f (last 10 steps), val loss (1 photo) %.4f -> %.4f\n",
              first, last, val_before, val_after);
  CHECK(first > 0.9);
  CHECK(last < 0.85 * first);
  CHECK(std::isfinite(val_after));

  // Interrupted after 23 steps (inside epoch 2), saved, loaded into a fresh trainer, finished.
  const std::string path = dir + "/run.safetensors";
  {
    Trainer part(std::make_unique<MaeObjective>(c, r, o, &train_photos, &val_photos));
    for (int s = 0; s < 23; ++s) part.step();
    save_checkpoint(part, path, {{"data", "photos:" + dir}});
  }
  const SavedTraining saved = load_checkpoint(path, "mae");
  CHECK(saved.objective == "mae");
  CHECK(MaeOptions::from_json(saved.options).shape.decoder_dim == 16);
  Trainer resumed(std::make_unique<MaeObjective>(saved.config, saved.recipe, MaeOptions::from_json(saved.options),
                                                 &train_photos, &val_photos));
  resumed.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  while (!resumed.finished()) resumed.step();
  CHECK(resumed.params() == full.params());

  // The model file is the encoder with timm names and no head: it loads as any model, and its
  // maps are those of the trained encoder. The decoder is in the state file only.
  const VitModel model = load_model(path);
  CHECK(model.w.num_classes == 0);
  CHECK(model.config.depth == 1);
  const SafetensorsFile model_file = read_safetensors(path);
  for (const auto& [name, tensor] : model_file.tensors) CHECK_FALSE(train::is_decoder_param(name));
  const SafetensorsFile state_file = read_safetensors(checkpoint_state_path(path));
  CHECK(state_file.tensors.count("mask_token") == 1);
  CHECK(state_file.tensors.count("decoder_pred.weight") == 1);
  CHECK(nlohmann::json::parse(model_file.metadata.at("training")).at("objective") == "mae");
  // Put a decoder tensor into a model file and the loader refuses it deliberately (one line).
  TensorMap with_decoder = model_file.tensors;
  with_decoder["mask_token"] = state_file.tensors.at("mask_token");
  CHECK_THROWS_WITH(model_from_tensors(model.config, with_decoder, "x"), Catch::Contains("mask_token"));
  // A classifier resume of an MAE checkpoint is refused with a reason.
  CHECK_THROWS_WITH(load_checkpoint(path, "classify"), Catch::Contains("mae"));
}

TEST_CASE("mae CLI: bad input gets one clear line, a tiny run opens in info and export", "[train][mae][cli]") {
  const std::string dir = test::temp_dir("mae-bad");
  const std::string empty = dir + "/empty", junk = dir + "/junk";
  ::mkdir(empty.c_str(), 0755);
  ::mkdir(junk.c_str(), 0755);
  std::ofstream(junk + "/a.jpg") << "not a jpeg";
  std::ofstream(junk + "/b.txt") << "text";
  struct Case {
    std::string args, expect;
    int code;
  };
  const std::vector<Case> cases = {
      {"train --data photos:" + empty + " --out " + dir + "/r", "no readable photo", 1},
      {"train --data photos:" + junk + " --out " + dir + "/r", "no readable photo", 1},
      {"train --data photos:" + dir + "/nowhere --out " + dir + "/r", "no such folder", 1},
      {"train --data photos --out " + dir + "/r --mask-ratio 1", "--mask-ratio", 2},
      {"train --data photos --out " + dir + "/r --mask-ratio 0", "--mask-ratio", 2},
      {"train --data photos --out " + dir + "/r --mask-ratio=-0.5", "--mask-ratio", 2},
      {"train --data photos --out " + dir + "/r --decoder-dim 30 --decoder-heads 4", "divisible", 2},
      {"train --data photos --out " + dir + "/r --img-size 8 --mask-ratio 0.9", "visible", 2},
      {"train --data fashion-mnist --out " + dir + "/r --mask-ratio 0.5", "photos", 2},
  };
  for (const Case& c : cases) {
    const Run r = run_vitlens(c.args);
    INFO("vitlens " << c.args << "\nstderr: " << r.err);
    REQUIRE(!c.expect.empty());  // every case names what its line says
    test::check_one_line_error(r, c.code, c.expect);
  }

  const std::string photos = photo_folder("mae-cli-photos");
  const std::string common = " --data photos:" + photos + " --img-size 16 --depth 1 --embed-dim 16 --heads 2 "
                             "--decoder-dim 8 --decoder-heads 2 --batch 8 --crops-per-photo 8 --epochs 2 --threads 2 --quiet";
  const Run a = run_vitlens("train" + common + " --out " + dir + "/a");
  INFO(a.err);
  REQUIRE(a.code == 0);
  CHECK(a.out.find("validation loss") != std::string::npos);
  const Run b1 = run_vitlens("train" + common + " --out " + dir + "/b --stop-after 3");
  REQUIRE(b1.code == 0);
  const Run b2 = run_vitlens("train --data photos:" + photos + " --quiet --resume " + dir + "/b/last.safetensors");
  INFO(b2.err);
  REQUIRE(b2.code == 0);
  const SafetensorsFile fa = read_safetensors(dir + "/a/last.safetensors");
  const SafetensorsFile fb = read_safetensors(dir + "/b/last.safetensors");
  for (const auto& [name, tensor] : fa.tensors) {
    INFO(name);
    CHECK(tensor.values == fb.tensors.at(name).values);
  }
  const auto record = nlohmann::json::parse(fa.metadata.at("training"));
  CHECK(record.at("objective") == "mae");
  CHECK(record.at("val_loss").get<double>() > 0.0);
  CHECK(record.at("mae").at("mask_ratio").get<double>() == 0.75);
  // Resuming an MAE run as a classifier (or the reverse) is one line.
  const Run wrong = run_vitlens("train --data fashion-mnist --resume " + dir + "/a/last.safetensors");
  CHECK(wrong.code == 2);
  CHECK(count_lines(wrong.err) == 1);
  // info and export open the encoder as any model; export writes maps for it.
  const Run info = run_vitlens("info --model " + dir + "/a/last.safetensors");
  INFO(info.err);
  CHECK(info.code == 0);
  const Run exp = run_vitlens("export " + photos + "/baboon.jpg --model " + dir + "/a/last.safetensors --out " + dir +
                              "/export");
  INFO(exp.err);
  CHECK(exp.code == 0);
  struct stat st {};
  CHECK(::stat((dir + "/export").c_str(), &st) == 0);
}

TEST_CASE("mae: the shipped MAE model is an encoder the Model menu lists, with its recipe and val loss", "[train][mae][bundled]") {
  const std::string path = assets_dir() + "/models/vitlens-mae-photos.safetensors";
  const VitModel model = load_model(path);
  CHECK(model.w.num_classes == 0);
  CHECK(model.config.patch_size == 4);
  CHECK(model.config.embed_dim == 48);
  CHECK(model.config.num_heads == 4);
  CHECK(model.config.class_token);
  const SafetensorsFile file = read_safetensors(path);
  const auto record = nlohmann::json::parse(file.metadata.at("training"));
  CHECK(record.at("objective") == "mae");
  CHECK(record.at("data") == "photos");
  CHECK(record.at("val_loss").get<double>() > 0.0);
  CHECK(record.at("recipe").at("epochs").get<int>() == record.at("epoch").get<int>());  // finished
  bool listed = false;
  for (const viewer::BundledModel& m : viewer::bundled_models(viewer::bundled_models_folder()))
    if (m.path.find("vitlens-mae-photos.safetensors") != std::string::npos) listed = m.error.empty() && m.name == model.config.name;
  CHECK(listed);
}
