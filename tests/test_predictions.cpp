// The classifier head (core/model/classifier.hpp) against the libraries' own logits, the top
// classes and their names, the padding left out of the mean, and what the CLI prints and records.
//
// The logits come from tests/fixtures/make_foreign_fixtures.py ("Predictions" section): each model
// built by the real library (timm 1.0.31, transformers 5.25), saved as the library publishes it,
// and run by that library in float64 on the saved values; manifest.json's "predictions" lists
// the cases with the library's top-5 (index, name).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "npy_support.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "core/io/image.hpp"
#include "core/model/classifier.hpp"
#include "models/bundled_models.hpp"
#include "models/model_io.hpp"

using namespace vitlens;

namespace {

const std::string kForeignDir = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

nlohmann::json foreign_manifest() { return nlohmann::json::parse(npy_file_bytes(kForeignDir + "manifest.json")); }

ForwardResult forward_on_fixture_image(const VitModel& model) {
  const cv::Mat rgb = load_image_rgb(kForeignDir + "image.png");
  const PreparedImage image = prepare_image(rgb, model.config, 0 /* native size: the 16x16 the library saw */);
  REQUIRE_FALSE(image.resized);
  return forward(model, image.grid, ForwardOptions{});
}

}  // namespace

TEST_CASE("classifier heads match their libraries' logits and top-5", "[parity][formats][predictions]") {
  const nlohmann::json manifest = foreign_manifest();
  const double tolerance = manifest.at("tolerance").get<double>();
  REQUIRE(tolerance == Approx(1e-5));
  REQUIRE(manifest.at("predictions").size() == 10);  // the script writes ten; fewer means stale fixtures
  for (const auto& c : manifest.at("predictions")) {
    const std::string name = c.at("name").get<std::string>();
    SECTION(name) {
      INFO("case " << name << " (" << c.at("source").get<std::string>() << ")");
      const VitModel model = load_model(kForeignDir + c.at("model").get<std::string>());
      REQUIRE(model.w.num_classes == c.at("classes").get<int>());
      const ForwardResult result = forward_on_fixture_image(model);
      const std::vector<float> logits = classifier_logits(model, result);
      const NpyArray want = read_npy(kForeignDir + c.at("logits").get<std::string>());
      REQUIRE(want.shape == std::vector<int64_t>{model.w.num_classes});
      REQUIRE(logits.size() == want.values.size());
      const double worst = max_abs_diff(logits.data(), want.values.data(), logits.size());
      CHECK(worst <= tolerance);
      // The order and the names the library gives its top five.
      const Predictions p = predict(model, result);
      REQUIRE(p.has_classifier);
      const auto& top5 = c.at("top5");
      REQUIRE(p.top.size() == top5.size());
      double total = 0.0;
      for (size_t i = 0; i < p.top.size(); ++i) {
        CHECK(p.top[i].index == top5[i][0].get<int>());
        CHECK(p.labels[i] == top5[i][1].get<std::string>());
        total += p.top[i].probability;
        if (i > 0) CHECK(p.top[i].probability <= p.top[i - 1].probability);
      }
      CHECK(total <= 1.0 + 1e-12);
      WARN(name << " [" << model.format << "]: max |d logit| " << worst << " over " << logits.size() << " classes; "
                << classifier_summary(model));
    }
  }
}

TEST_CASE("each family's classifier reads the tokens as its library does", "[formats][predictions]") {
  struct Expect {
    const char* name;
    HeadPool pool;
    bool fc_norm, dist, include_prefix;
    const char* first_name;  // class 0's name, "" when the model has none
  };
  const Expect expects[] = {
      {"timm_vit", HeadPool::Token, false, false, false, ""},
      {"timm_deit_distilled", HeadPool::Token, false, true, false, ""},
      {"timm_gap_fcnorm", HeadPool::Avg, true, false, false, "red square"},
      {"timm_avgmax", HeadPool::AvgMax, false, false, true, ""},
      {"timm_in1k", HeadPool::Token, false, false, false, "tench, Tinca tinca"},
      {"timm_siglip_head", HeadPool::Map, false, false, false, "red square"},
      {"timm_eva02_head", HeadPool::Avg, true, false, false, ""},
      {"hf_vit_cls", HeadPool::Token, false, false, false, "LABEL_0"},
      {"hf_deit_teacher", HeadPool::Token, false, true, false, "LABEL_0"},
      {"hf_deit_cls", HeadPool::Token, false, false, false, "cat"},
  };
  for (const Expect& e : expects) {
    INFO(e.name);
    const VitModel m = load_model(kForeignDir + e.name + "/model.safetensors");
    CHECK(m.config.head_pool == e.pool);
    CHECK((m.w.fc_norm_w != nullptr) == e.fc_norm);
    CHECK((m.w.head_dist_w != nullptr) == e.dist);
    CHECK(m.config.pool_include_prefix == e.include_prefix);
    if (*e.first_name) {
      REQUIRE(static_cast<int>(m.class_names.size()) == m.w.num_classes);
      CHECK(m.class_names[0] == e.first_name);
    } else {
      CHECK(m.class_names.empty());
      CHECK(class_label(m, 3) == "class 3");
    }
  }
  const VitModel in1k = load_model(kForeignDir + "timm_in1k/model.safetensors");
  CHECK(in1k.class_names.size() == 1000);
  CHECK(in1k.class_names[999] == "toilet tissue, toilet paper, bathroom tissue");
  CHECK_THAT(in1k.class_names_source, Catch::Contains("ImageNet-1k"));
  const VitModel gap = load_model(kForeignDir + "timm_gap_fcnorm/model.safetensors");
  CHECK(gap.class_names_source == "config.json label_names and label_descriptions");
  CHECK(load_model(kForeignDir + "hf_deit_cls/model.safetensors").class_names_source == "config.json id2label");

  // Without a head: no logits, no predictions, and said in one line.
  for (const char* headless : {"timm_dinov2", "hf_dinov2", "hf_clip", "timm_siglip_gap"}) {
    INFO(headless);
    const VitModel m = load_model(kForeignDir + headless + "/model.safetensors");
    CHECK(m.w.num_classes == 0);
    const ForwardResult r = forward_on_fixture_image(m);
    CHECK(classifier_logits(m, r).empty());
    CHECK_FALSE(predict(m, r).has_classifier);
    CHECK_THAT(classifier_summary(m), Catch::StartsWith("none: the model has no classifier head"));
  }
}

TEST_CASE("average pooling reads the image's patches and leaves the padding out", "[predictions]") {
  // A forward whose last grid row is marked padding: its logits are those of the same tokens with
  // the padding rows removed. The class token's head (Token) does not read the patches at all.
  const VitModel model = load_model(kForeignDir + "timm_gap_fcnorm/model.safetensors");
  const ForwardResult full = forward_on_fixture_image(model);
  const int patches = full.grid_h * full.grid_w, prefix = full.prefix, padded = full.grid_w;
  ForwardResult with_padding = full;
  with_padding.patch_is_padding.assign(static_cast<size_t>(patches), 0);
  for (int p = patches - padded; p < patches; ++p) with_padding.patch_is_padding[static_cast<size_t>(p)] = 1;
  ForwardResult cut = full;
  cut.tokens = full.tokens - padded;
  cut.grid_h = full.grid_h - 1;
  cut.output = full.output.topRows(cut.tokens);
  cut.patch_is_padding.clear();
  const std::vector<float> a = classifier_logits(model, with_padding), b = classifier_logits(model, cut),
                           all = classifier_logits(model, full);
  REQUIRE(a.size() == 6);
  CHECK(max_abs_diff(a.data(), b.data(), a.size()) <= 1e-6);
  CHECK(max_abs_diff(a.data(), all.data(), a.size()) > 1e-3);  // the padding rows would have counted
  const Predictions p = predict(model, with_padding);
  CHECK(p.pooled_patches == patches - padded);
  CHECK(p.padding_patches == padded);
  CHECK(prefix == 3);  // class token and 2 registers, left out of the mean (timm's num_prefix_tokens)
}

TEST_CASE("top classes: highest first, ties to the lower index, softmax over every class", "[predictions]") {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f, 3.0f};
  const std::vector<ClassScore> top = top_classes(logits, 5);
  REQUIRE(top.size() == 5);
  const int order[] = {1, 2, 6, 5, 0};
  double total = 0.0;
  for (double v : logits) total += std::exp(v - 3.0);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(top[i].index == order[i]);
    CHECK(top[i].probability == Approx(std::exp(logits[static_cast<size_t>(order[i])] - 3.0) / total).epsilon(1e-12));
  }
  CHECK(top_classes({0.5f, 0.25f}, 5).size() == 2);  // fewer classes than asked: all of them
  CHECK(top_classes({}, 5).empty());
  CHECK(prediction_line(1, 0.87312, "tabby cat") == "1.  87.31 %  tabby cat");
}

TEST_CASE("the bundled Fashion-MNIST classifier names its classes from its training record", "[predictions][assets]") {
  const VitModel m = load_model(resolve_model("fashion-mnist"));
  REQUIRE(m.w.num_classes == 10);
  REQUIRE(m.class_names.size() == 10);
  CHECK(m.class_names[0] == "T-shirt/top");
  CHECK(m.class_names[9] == "Ankle boot");
  CHECK(m.class_names_source == "the training record");
  CHECK_THAT(classifier_summary(m), Catch::StartsWith("10 classes (names from the training record), class token"));
  const VitModel designed = load_model(resolve_model(""));
  CHECK(designed.w.num_classes == 0);
}

TEST_CASE("cli: export prints the top-5 and records them, info names the classifier, a model without one says so",
          "[cli][predictions]") {
  const std::string dir = test::temp_dir("cli-predictions");
  const std::string image = kForeignDir + "image.png";
  const test::ShellRun info = test::run_vitlens_shell(dir, "info --model " + kForeignDir + "hf_deit_cls/model.safetensors");
  CHECK(info.code == 0);
  CHECK_THAT(info.out, Catch::Contains("classifier:   4 classes (names from config.json id2label), class token") &&
                           Catch::Contains("class names:  0 'cat', 1 'dog', 2 'teapot', 3 'a long name, with a comma'"));

  const nlohmann::json manifest = foreign_manifest();
  nlohmann::json want;
  for (const auto& c : manifest.at("predictions"))
    if (c.at("name") == "timm_gap_fcnorm") want = c;
  REQUIRE(want.is_object());
  const test::ShellRun run = test::run_vitlens_shell(
      dir, "export " + image + " --model " + kForeignDir + "timm_gap_fcnorm/model.safetensors --size 0 --out " + dir + "/gap");
  REQUIRE(run.code == 0);
  // One line per class under the image's line: rank, probability, name, in the library's order.
  std::vector<std::string> lines;
  for (size_t at = 0, end; (end = run.out.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(run.out.substr(at, end - at));
  REQUIRE(lines.size() == 6);
  const nlohmann::json record = nlohmann::json::parse(test::slurp(dir + "/gap/image.json"));
  REQUIRE(record.at("predictions").size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    const nlohmann::json& p = record["predictions"][i];
    CHECK(p.at("rank") == i + 1);
    CHECK(p.at("index") == want["top5"][i][0]);
    CHECK(p.at("label") == want["top5"][i][1]);
    CHECK(lines[i + 1] == "  " + prediction_line(static_cast<int>(i) + 1, p.at("probability").get<double>(),
                                                  p.at("label").get<std::string>()));
  }
  CHECK(record.at("classifier").at("classes") == 6);
  CHECK(record["classifier"].at("forward") == "the model's own");
  CHECK_THAT(record["classifier"].at("pool").get<std::string>(), Catch::Contains("over the 16 patches of the image"));

  // Whole-image mode on a wide image: the padding rows are left out, and the record says so.
  cv::Mat wide = load_image_rgb(image);
  cv::Mat wider;
  cv::hconcat(wide, wide, wider);
  cv::Mat bgr;
  cv::Mat(wider(cv::Rect(0, 0, 32, 14)) * 255.0).convertTo(bgr, CV_8UC3);
  cv::cvtColor(bgr, bgr, cv::COLOR_RGB2BGR);
  cv::imwrite(dir + "/wide.png", bgr);
  const test::ShellRun padded = test::run_vitlens_shell(
      dir, "export " + dir + "/wide.png --model " + kForeignDir + "timm_gap_fcnorm/model.safetensors --size 32 --out " + dir + "/wide");
  REQUIRE(padded.code == 0);
  const nlohmann::json wide_record = nlohmann::json::parse(test::slurp(dir + "/wide/wide.json"));
  CHECK_THAT(wide_record.at("classifier").at("pool").get<std::string>(),
             Catch::Contains("padding patches left out (the library never sees padding)"));

  // A model without a head: no prediction lines, and the record says plainly why.
  const test::ShellRun none = test::run_vitlens_shell(
      dir, "export " + image + " --model " + kForeignDir + "timm_dinov2/model.safetensors --size 0 --out " + dir + "/none");
  REQUIRE(none.code == 0);
  CHECK(test::count_lines(none.out) == 1);
  const nlohmann::json none_record = nlohmann::json::parse(test::slurp(dir + "/none/image.json"));
  CHECK(none_record.at("predictions").empty());
  CHECK_THAT(none_record.at("classifier").get<std::string>(), Catch::StartsWith("none: the model has no classifier head"));
}
