// The names of the viewer's own enums (app_state.hpp), each one table (core/base/enum_names.hpp).
#include "control/app_state.hpp"

#include "core/base/enum_names.hpp"

namespace vitlens::viewer {

namespace {

constexpr EnumName<MaskMode> kMaskModeNames[] = {
    {MaskMode::None, "none"}, {MaskMode::Padding, "padding"}, {MaskMode::Causal, "causal"}, {MaskMode::Painted, "painted"}};

constexpr EnumName<ScaleMode> kScaleModeNames[] = {
    {ScaleMode::Model, "default"}, {ScaleMode::Unscaled, "none"}, {ScaleMode::Temperature, "temperature"}};

constexpr EnumName<Preprocess> kPreprocessNames[] = {{Preprocess::Whole, "whole"}, {Preprocess::Model, "model"}};

constexpr EnumName<Brush> kBrushNames[] = {{Brush::Paint, "paint"}, {Brush::Erase, "erase"}, {Brush::Off, "off"}};

constexpr EnumName<BrowserPurpose> kBrowserPurposeNames[] = {{BrowserPurpose::OpenImage, "open image"},
                                                             {BrowserPurpose::OpenModel, "open model"},
                                                             {BrowserPurpose::ExportFolder, "export folder"},
                                                             {BrowserPurpose::ScreenshotFile, "screenshot file"}};

constexpr EnumName<WidgetKind> kWidgetKindNames[] = {
    {WidgetKind::Button, "button"},         {WidgetKind::Checkbox, "checkbox"},
    {WidgetKind::Radio, "radio"},           {WidgetKind::Slider, "slider"},
    {WidgetKind::Combo, "combo"},           {WidgetKind::Input, "input"},
    {WidgetKind::Menu, "menu"},             {WidgetKind::MenuItem, "menu item"},
    {WidgetKind::Selectable, "selectable"}, {WidgetKind::Header, "header"},
    {WidgetKind::TreeNode, "tree node"},    {WidgetKind::Picture, "picture"},
    {WidgetKind::DropTarget, "drop target"}};

}  // namespace

const char* mask_mode_name(MaskMode mode) { return enum_name(kMaskModeNames, mode); }
bool parse_mask_mode(const std::string& name, MaskMode& mode) { return parse_enum(kMaskModeNames, name, mode); }
const char* scale_mode_name(ScaleMode mode) { return enum_name(kScaleModeNames, mode); }
const char* preprocess_name(Preprocess p) { return enum_name(kPreprocessNames, p); }
bool parse_preprocess(const std::string& name, Preprocess& p) { return parse_enum(kPreprocessNames, name, p); }
const char* brush_name(Brush brush) { return enum_name(kBrushNames, brush); }
const char* browser_purpose_name(BrowserPurpose purpose) { return enum_name(kBrowserPurposeNames, purpose); }
const char* widget_kind_name(WidgetKind kind) { return enum_name(kWidgetKindNames, kind); }

}  // namespace vitlens::viewer
