#pragma once
// Literal strings of the DeepSeek-V4 prompt format (CHAT_FORMAT.md §1.2, §2). `｜` is U+FF5C, `▁` is U+2581.
#include <string_view>

namespace dsv4::text::chat {

inline constexpr std::string_view kBos = "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>";
inline constexpr std::string_view kEos = "<\uFF5Cend\u2581of\u2581sentence\uFF5C>";
inline constexpr std::string_view kUser = "<\uFF5CUser\uFF5C>";
inline constexpr std::string_view kAssistant = "<\uFF5CAssistant\uFF5C>";
inline constexpr std::string_view kLatestReminder = "<\uFF5Clatest_reminder\uFF5C>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "\uFF5CDSML\uFF5C";

// DSML markup, spelled out (the DSML marker is one token, the rest is ordinary text).
inline constexpr std::string_view kToolCallsOpen = "<\uFF5CDSML\uFF5Ctool_calls>";
inline constexpr std::string_view kToolCallsClose = "</\uFF5CDSML\uFF5Ctool_calls>";
inline constexpr std::string_view kInvokeOpen = "<\uFF5CDSML\uFF5Cinvoke";
inline constexpr std::string_view kInvokeClose = "</\uFF5CDSML\uFF5Cinvoke>";
inline constexpr std::string_view kParamOpen = "<\uFF5CDSML\uFF5Cparameter";
inline constexpr std::string_view kParamClose = "</\uFF5CDSML\uFF5Cparameter>";

}  // namespace dsv4::text::chat
