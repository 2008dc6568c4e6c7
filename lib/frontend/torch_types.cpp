//===- lib/frontend/torch_types.cpp - Torch enums <-> apc and export serde -===//
#include "torch_types.h"

#include "apc/support/strings.h"

namespace apc::frontend {

std::string torchErrorLine(const std::string& what) {
  // The first line that says something: some of LibTorch's messages open with a newline.
  std::string line;
  for (const std::string& l : split(what, '\n'))
    if (!trim(l).empty()) {
      line = l;
      break;
    }
  // An archive that calls an operator this LibTorch does not register (torchvision's nms, a
  // custom extension's op): the loader's message goes on with a suggestion and a source excerpt.
  if (size_t at = line.find("Unknown builtin op: "); at != std::string::npos) {
    std::string op(trim(line.substr(at + 20)));
    if (!op.empty() && op.back() == '.') op.pop_back();
    return "it calls operator " + op +
           ", which apc's LibTorch does not register (a library such as torchvision or a custom "
           "extension defines it; export the model without it)";
  }
  // An error inside TorchScript code opens with a fixed header and a traceback; its cause is the
  // last "SomethingError: message" line.
  if (line.rfind("The following operation failed in the TorchScript interpreter", 0) == 0) {
    std::string cause;
    for (const std::string& l : split(what, '\n')) {
      std::string_view t = trim(l);
      size_t colon = t.find("Error: ");
      if (colon != std::string_view::npos && colon > 0 &&
          t.substr(0, colon).find(' ') == std::string_view::npos)
        cause = std::string(t.substr(colon + 7));
    }
    if (!cause.empty()) line = cause;
  }
  if (size_t advice = line.find(". This is an internal miniz error"); advice != std::string::npos)
    line.resize(advice);
  return std::string(trim(line));
}

std::string torchErrorLine(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return torchErrorLine(std::string(c10_error->what_without_backtrace()));
  return torchErrorLine(std::string(e.what()));
}

std::string tensorIdentity(const at::Tensor& t) {
  std::string key;
  const void* data = t.has_storage() ? t.storage().data() : nullptr;
  if (data) {
    key = std::to_string(reinterpret_cast<uintptr_t>(data)) + "@" +
          std::to_string(t.storage_offset());
  } else {
    key = "impl" + std::to_string(reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()));
  }
  for (auto s : t.sizes()) key += "," + std::to_string(s);
  key += "/";
  for (auto s : t.strides()) key += "," + std::to_string(s);
  return key + "/" + std::to_string(static_cast<int>(t.scalar_type()));
}

std::optional<at::ScalarType> scalarTypeFromSerde(int64_t code) {
  switch (code) {
    case 1:
      return at::kByte;
    case 2:
      return at::kChar;
    case 3:
      return at::kShort;
    case 4:
      return at::kInt;
    case 5:
      return at::kLong;
    case 6:
      return at::kHalf;
    case 7:
      return at::kFloat;
    case 8:
      return at::kDouble;
    case 9:
      return at::kComplexHalf;
    case 10:
      return at::kComplexFloat;
    case 11:
      return at::kComplexDouble;
    case 12:
      return at::kBool;
    case 13:
      return at::kBFloat16;
    case 28:
      return at::kUInt16;
    case 29:
      return at::kFloat8_e4m3fn;
    case 30:
      return at::kFloat8_e5m2;
    case 31:
      return at::kFloat8_e4m3fnuz;
    case 32:
      return at::kFloat8_e5m2fnuz;
    case 33:
      return at::kFloat8_e8m0fnu;
    case 34:
      return at::kUInt32;
    case 35:
      return at::kUInt64;
    default:
      return std::nullopt;
  }
}

std::optional<at::Layout> layoutFromSerde(int64_t code) {
  switch (code) {
    case 1:
      return at::kSparse;
    case 2:
      return at::kSparseCsr;
    case 3:
      return at::kSparseCsc;
    case 4:
      return at::kSparseBsr;
    case 5:
      return at::kSparseBsc;
    case 6:
      return at::kMkldnn;
    case 7:
      return at::kStrided;
    default:
      return std::nullopt;
  }
}

std::optional<at::MemoryFormat> memoryFormatFromSerde(int64_t code) {
  switch (code) {
    case 1:
      return at::MemoryFormat::Contiguous;
    case 2:
      return at::MemoryFormat::ChannelsLast;
    case 3:
      return at::MemoryFormat::ChannelsLast3d;
    case 4:
      return at::MemoryFormat::Preserve;
    default:
      return std::nullopt;
  }
}

}  // namespace apc::frontend
