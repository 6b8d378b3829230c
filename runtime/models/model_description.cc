// build_model: walks the JSON description once, checking each layer's keys and the width flowing through, and
// builds the layers as it goes. The description is the user's input, so each refusal says where (the layer's
// path), what (the key and the value found) and what would be accepted.
#include "runtime/models/model_description.h"

#include <cmath>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <utility>

#include "runtime/core/check.h"

namespace ddp {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::int64_t kMaxWidth = std::int64_t{1} << 24;
constexpr const char* kTypes =
    "linear, relu, gelu, tanh, sigmoid, silu, layer_norm, residual, frequency_encoding, dropout";

// The keys each type takes besides "type".
const std::vector<std::pair<std::string, std::vector<std::string>>>& layer_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> keys = {
      {"linear", {"out", "in", "bias"}},
      {"relu", {}},
      {"gelu", {}},
      {"tanh", {}},
      {"sigmoid", {}},
      {"silu", {}},
      {"layer_norm", {"eps"}},
      {"residual", {"body", "projection"}},
      {"frequency_encoding", {"frequencies", "include_input"}},
      {"dropout", {"p"}},
  };
  return keys;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  return out;
}

// One layer's object, at `where` ("layers[1].body[0] (linear)"), with typed reads of its keys.
class LayerSpec {
 public:
  LayerSpec(const json& spec, std::string where) : spec_(spec), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument("model description: " + where_ + ": " + what);
  }
  const std::string& where() const { return where_; }
  bool has(const char* key) const { return spec_.contains(key); }
  const json& at(const char* key) const { return spec_.at(key); }

  // An integer in [low, high]; `fallback` when absent, or a refusal when there is none.
  std::int64_t integer(const char* key, std::int64_t low, std::int64_t high, const char* meaning,
                       const std::int64_t* fallback = nullptr) const {
    if (!has(key)) {
      if (fallback != nullptr) return *fallback;
      fail(std::string("key \"") + key + "\" is missing: give " + meaning);
    }
    const json& v = spec_.at(key);
    const bool fits = v.is_number_integer() &&
                      (v.is_number_unsigned() ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(high)
                                              : v.get<std::int64_t>() >= low && v.get<std::int64_t>() <= high);
    if (!fits || v.get<std::int64_t>() < low) {
      const std::string range = low == 1 && high == kMaxWidth ? "a positive integer (at most 16777216)"
                                                              : "an integer from " + std::to_string(low) + " to " +
                                                                    std::to_string(high);
      fail(std::string("key \"") + key + "\" must be " + range + ", got " + v.dump());
    }
    return v.get<std::int64_t>();
  }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = spec_.at(key);
    if (!v.is_boolean()) fail(std::string("key \"") + key + "\" must be true or false, got " + v.dump());
    return v.get<bool>();
  }

  // A number with low <= x < high (low < x when `open_low`).
  double number(const char* key, double fallback, double low, double high, bool open_low, const char* range) const {
    if (!has(key)) return fallback;
    const json& v = spec_.at(key);
    const double x = v.is_number() ? v.get<double>() : std::nan("");
    if (!v.is_number() || !std::isfinite(x) || x < low || (open_low && x == low) || x >= high) {
      fail(std::string("key \"") + key + "\" must be " + range + ", got " + v.dump());
    }
    return x;
  }

 private:
  const json& spec_;
  std::string where_;
};

class Builder {
 public:
  Builder(std::uint64_t seed, const Device& device, const Stream& stream)
      : seed_(seed), device_(device), stream_(stream) {}

  // The layers of the list `layers` (at `path`, e.g. "layers" or "layers[1].body") applied in order to `width`
  // columns, which becomes the width they give; their canonical descriptions are appended to `canonical`.
  std::shared_ptr<Sequential> sequence(const json& layers, const std::string& path, std::int64_t& width,
                                       ordered_json& canonical) {
    auto out = std::make_shared<Sequential>();
    canonical = ordered_json::array();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      ordered_json c;
      out->add(layer(layers[i], path + "[" + std::to_string(i) + "]", width, c));
      canonical.push_back(std::move(c));
    }
    return out;
  }

 private:
  std::shared_ptr<Module> layer(const json& spec, const std::string& path, std::int64_t& width,
                                ordered_json& canonical) {
    if (!spec.is_object()) {
      throw InvalidArgument("model description: " + path + " must be a JSON object such as {\"type\": \"relu\"}, got " +
                            spec.dump());
    }
    const auto type_it = spec.find("type");
    if (type_it == spec.end() || !type_it->is_string()) {
      throw InvalidArgument("model description: " + path + ": key \"type\" " +
                            (type_it == spec.end() ? std::string("is missing") : "must be a string, got " + type_it->dump()) +
                            ": give one of " + kTypes);
    }
    const std::string type = type_it->get<std::string>();
    const std::vector<std::string>* keys = nullptr;
    for (const auto& [name, allowed] : layer_keys()) {
      if (name == type) keys = &allowed;
    }
    if (keys == nullptr) {
      throw InvalidArgument("model description: " + path + ": unknown type \"" + type + "\": the types are " + kTypes);
    }
    const LayerSpec s(spec, path + " (" + type + ")");
    for (auto it = spec.begin(); it != spec.end(); ++it) {
      if (it.key() == "type") continue;
      bool known = false;
      for (const std::string& k : *keys) known = known || k == it.key();
      if (!known) {
        s.fail("unknown key \"" + it.key() + "\": " +
               (keys->empty() ? "a " + type + " takes only \"type\"" : "a " + type + " takes " + quoted_list(*keys)));
      }
    }
    canonical = ordered_json::object();
    canonical["type"] = type;

    if (type == "linear") return linear(s, width, canonical);
    if (type == "layer_norm") {
      const double eps = s.number("eps", 1e-5, 0.0, INFINITY, true, "a positive number");
      canonical["eps"] = eps;
      return std::make_shared<LayerNorm>(width, eps, device_, stream_);
    }
    if (type == "residual") return residual(s, width, canonical);
    if (type == "frequency_encoding") {
      const std::int64_t frequencies = s.integer("frequencies", 0, 64, "the number of frequencies (0 to 64)");
      const bool include_input = s.boolean("include_input", true);
      if (!include_input && frequencies == 0) {
        s.fail("no frequencies and \"include_input\": false would give no columns: add frequencies or include the input");
      }
      canonical["frequencies"] = frequencies;
      canonical["include_input"] = include_input;
      auto encoding = std::make_shared<FrequencyEncoding>(width, frequencies, include_input);
      width = encoding->out_features();
      if (width > kMaxWidth) s.fail("gives " + std::to_string(width) + " columns, more than 16777216: use fewer frequencies");
      return encoding;
    }
    if (type == "dropout") {
      const double p = s.number("p", 0.5, 0.0, 1.0, false, "a probability in [0, 1)");
      canonical["p"] = p;
      // Each Dropout its own seed: two with one seed would drop the same columns of equally wide inputs.
      const std::uint64_t seed = seed_ ^ (0x9E3779B97F4A7C15ULL * ++dropouts_);
      return std::make_shared<Dropout>(p, seed, device_, stream_);
    }
    return std::make_shared<ActivationLayer>(parse_activation(type));
  }

  std::shared_ptr<Module> linear(const LayerSpec& s, std::int64_t& width, ordered_json& canonical) {
    const std::int64_t out = s.integer("out", 1, kMaxWidth, "the layer's output width, e.g. \"out\": 64");
    if (s.has("in")) {
      const std::int64_t in = s.integer("in", 1, kMaxWidth, "the layer's input width");
      if (in != width) {
        s.fail("key \"in\" is " + std::to_string(in) + ", but the layers before give " + std::to_string(width) +
               " columns: make it " + std::to_string(width) + " or leave it out");
      }
    }
    const bool bias = s.boolean("bias", true);
    canonical["in"] = width;
    canonical["out"] = out;
    canonical["bias"] = bias;
    auto layer = std::make_shared<Linear>(width, out, bias, seed_, offset_, device_, stream_);
    // A layer without a bias still skips the bias's counters, so that its neighbours draw as with one.
    offset_ += layer->init_counters();
    width = out;
    return layer;
  }

  std::shared_ptr<Module> residual(const LayerSpec& s, std::int64_t& width, ordered_json& canonical) {
    const auto list = [&](const char* key) -> const json& {
      const json& v = s.at(key);
      if (!v.is_array() || v.empty()) {
        s.fail(std::string("key \"") + key + "\" must be a non-empty list of layers, got " + v.dump());
      }
      return v;
    };
    if (!s.has("body")) s.fail("key \"body\" is missing: give the block's layers, e.g. \"body\": [{\"type\": \"linear\", \"out\": 64}]");
    const std::string path = s.where().substr(0, s.where().find(' '));
    std::int64_t body_width = width;
    ordered_json body_canonical;
    auto body = sequence(list("body"), path + ".body", body_width, body_canonical);
    canonical["body"] = std::move(body_canonical);
    std::shared_ptr<Sequential> projection;
    if (s.has("projection")) {
      std::int64_t projection_width = width;
      ordered_json projection_canonical;
      projection = sequence(list("projection"), path + ".projection", projection_width, projection_canonical);
      canonical["projection"] = std::move(projection_canonical);
      if (projection_width != body_width) {
        s.fail("the body gives " + std::to_string(body_width) + " columns but the projection gives " +
               std::to_string(projection_width) + ": make them end in the same width");
      }
    } else if (body_width != width) {
      s.fail("the body turns " + std::to_string(width) + " columns into " + std::to_string(body_width) +
             " and there is no \"projection\": add one, e.g. \"projection\": [{\"type\": \"linear\", \"out\": " +
             std::to_string(body_width) + "}], or make the body end in " + std::to_string(width) + " columns");
    }
    width = body_width;
    return std::make_shared<ResidualBlock>(std::move(body), std::move(projection));
  }

  std::uint64_t seed_;
  const Device& device_;
  const Stream& stream_;
  std::uint64_t offset_ = 0;    // the next Linear's first counter
  std::uint64_t dropouts_ = 0;  // Dropouts made so far
};

}  // namespace

DescribedModel build_model(const std::string& text, std::uint64_t seed, const Device& device, const Stream& stream) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InvalidArgument(std::string("model description: not valid JSON (") + e.what() +
                          "): give an object such as {\"inputs\": 5, \"layers\": [{\"type\": \"linear\", \"out\": 1}]}");
  }
  if (!doc.is_object()) {
    throw InvalidArgument("model description: must be a JSON object with keys \"inputs\" and \"layers\", got " +
                          doc.dump());
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "inputs" && it.key() != "layers") {
      throw InvalidArgument("model description: unknown key \"" + it.key() +
                            "\": a description takes \"inputs\" and \"layers\"");
    }
  }
  const LayerSpec top(doc, "the top level");
  DescribedModel out;
  out.inputs = top.integer("inputs", 1, kMaxWidth, "the model's input width, e.g. \"inputs\": 5");
  if (!top.has("layers") || !top.at("layers").is_array() || top.at("layers").empty()) {
    top.fail(std::string("key \"layers\" ") +
             (top.has("layers") ? "must be a non-empty list of layers, got " + top.at("layers").dump()
                                : std::string("is missing: give the model's layers, e.g. \"layers\": [{\"type\": "
                                              "\"linear\", \"out\": 1}]")));
  }
  std::int64_t width = out.inputs;
  ordered_json layers;
  Builder builder(seed, device, stream);
  out.model = builder.sequence(doc.at("layers"), "layers", width, layers);
  out.outputs = width;
  ordered_json canonical = ordered_json::object();
  canonical["inputs"] = out.inputs;
  canonical["layers"] = std::move(layers);
  out.architecture = canonical.dump();
  return out;
}

}  // namespace ddp
