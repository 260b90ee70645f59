// The bundled models by name (vitlens/bundled_models.hpp): every name resolves to its file, a
// path or an existing file wins over a name, an unknown name is one line listing the names, and
// each model's one-line summary comes from its own file.
#include <catch2/catch.hpp>

#include <fstream>

#include <unistd.h>

#include "control/controller.hpp"
#include "test_support.hpp"
#include "training/train_panel.hpp"
#include "models/bundled_models.hpp"
#include "core/base/error.hpp"

using namespace vitlens;

TEST_CASE("bundled models: every name opens its file, the names are listed", "[bundled][names]") {
  const std::vector<BundledModelEntry> models = list_bundled_models();
  std::vector<std::string> names;
  for (const BundledModelEntry& m : models) {
    INFO(m.path << ": " << m.error);
    CHECK(m.error.empty());
    names.push_back(m.name);
    CHECK(resolve_model(m.name) == m.path);
    CHECK(load_model(resolve_model(m.name)).config.name == m.config.name);
  }
  CHECK(names == std::vector<std::string>{"designed", "fashion-mnist", "mae-photos", "random"});
  CHECK(resolve_model("designed") == default_model_path());
  CHECK(resolve_model("random") == random_model_path());
  CHECK(resolve_model("") == default_model_path());
}

TEST_CASE("bundled models: a path or an existing file wins over a name", "[bundled][names]") {
  const std::string dir = test::temp_dir("names");
  CHECK(resolve_model(dir + "/designed") == dir + "/designed");  // has '/': a path, even when missing
  char old_cwd[4096];
  REQUIRE(::getcwd(old_cwd, sizeof old_cwd));
  REQUIRE(::chdir(dir.c_str()) == 0);
  std::ofstream("random") << "a user's file named like a bundled model";
  const std::string in_cwd = resolve_model("random");
  const std::string named = resolve_model("designed");
  REQUIRE(::chdir(old_cwd) == 0);
  CHECK(in_cwd == "random");
  CHECK(named == default_model_path());
}

TEST_CASE("bundled models: an unknown name is one line naming the bundled ones", "[bundled][names]") {
  CHECK_THROWS_WITH(resolve_model("no-such-model"), Catch::Contains("no-such-model: cannot open a model file (no such file") &&
                                                        Catch::Contains("designed, fashion-mnist, mae-photos, random"));
  CHECK(bundled_model_name("/x/vitlens-designed.safetensors") == "designed");
  CHECK(bundled_model_name("/x/vitlens-run.state.safetensors").empty());  // a training run's optimizer state
  CHECK(bundled_model_name("/x/designed.safetensors").empty());
  CHECK(bundled_model_name("/x/vitlens-.safetensors").empty());
}

TEST_CASE("bundled models: each summary is the file's shape and measured result", "[bundled][names]") {
  for (const BundledModelEntry& m : list_bundled_models()) {
    const std::string line = bundled_model_summary(m);
    INFO(m.name << ": " << line);
    CHECK(line.find('\n') == std::string::npos);
    if (m.name == "designed") CHECK(line == "depth 1, 4 heads, patch 4, 224x224; Hand-designed, not trained");
    if (m.name == "random") CHECK(line == "depth 1, 4 heads, patch 4, 224x224; Random initialisation, untrained");
    if (m.name == "fashion-mnist")
      CHECK(line == "depth 4, 4 heads, patch 4, 28x28; classifier trained on fashion-mnist (10 classes), 90.28 % test accuracy");
    if (m.name == "mae-photos")
      CHECK(line == "depth 4, 4 heads, patch 4, 64x64; masked patch prediction (MAE) on 82 photos, validation loss 0.744");
  }
}

TEST_CASE("bundled models: the viewer's model-menu command takes the same names", "[bundled][names]") {
  viewer::App app;
  viewer::ScriptCommand c;
  c.verb = "model-menu";
  for (const BundledModelEntry& m : list_bundled_models()) {
    c.args = {m.name};
    INFO(m.name);
    CHECK(viewer::apply_train_command(app, c) == "");
    CHECK(app.requests.open_model == m.path);
  }
}
