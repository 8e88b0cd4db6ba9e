#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Unicode White_Space (what Rust's char::is_whitespace tests), for lstrip/rstrip.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

uint32_t decode_at(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// Length of the white-space character ending at s[end-1], or 0.
size_t white_space_before(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 4 && len <= end; ++len) {
    const size_t i = end - len;
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    return utf8_sequence_length(s, i) == len && is_white_space(decode_at(s, i, len)) ? len : 0;
  }
  return 0;
}
size_t white_space_at(std::string_view s, size_t i) {
  const size_t len = utf8_sequence_length(s, i);
  return len > 0 && is_white_space(decode_at(s, i, len)) ? len : 0;
}

// Leftmost-longest matcher over a set of strings (a byte trie).
class AddedTokenMatcher {
 public:
  void add(std::string_view content, int32_t index) {
    int32_t node = 0;
    if (nodes_.empty()) nodes_.emplace_back();
    for (unsigned char c : content) {
      int32_t child = -1;
      for (auto [ch, n] : nodes_[node].edges)
        if (ch == c) child = n;
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].edges.emplace_back(c, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = index;
    first_[static_cast<unsigned char>(content[0])] = true;
  }
  bool empty() const { return nodes_.empty(); }

  struct Hit {
    size_t begin, end;
    int32_t token;
  };
  // The leftmost match at or after `from`, longest at its position.
  std::optional<Hit> find(std::string_view s, size_t from) const {
    for (size_t i = from; i < s.size(); ++i) {
      if (!first_[static_cast<unsigned char>(s[i])]) continue;
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        int32_t child = -1;
        for (auto [ch, n] : nodes_[node].edges)
          if (ch == static_cast<unsigned char>(s[j])) {
            child = n;
            break;
          }
        if (child < 0) break;
        node = child;
        if (nodes_[node].token >= 0) {
          best = nodes_[node].token;
          best_end = j + 1;
        }
      }
      if (best >= 0) return Hit{i, best_end, best};
    }
    return std::nullopt;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> edges;
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

struct PieceCache {
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  // Bounded: when full it is cleared (simple, and a working set of natural text refills fast).
  static constexpr size_t kMaxEntries = 1 << 17;
  static constexpr size_t kMaxPieceBytes = 256;
};

Expected<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return Status::io_error("cannot open " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::io_error("cannot read " + p.string());
  return ss.str();
}

// A token in tokenizer_config.json: a string or an AddedToken object {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

struct Tokenizer::Impl {
  BpeModel bpe;
  PreTokenizer pre;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_ids;
  AddedTokenMatcher raw_matcher, normalized_matcher;  // normalized=false / normalized=true
  std::vector<bool> special;                          // id -> special added token
  std::optional<int32_t> bos, eos;
  bool add_bos = false, add_eos = false;
  std::unique_ptr<PieceCache> cache = std::make_unique<PieceCache>();
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

Status parse_normalizer(const json& n) {
  if (n.is_null()) return Status::ok();
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const json& s : n.value("normalizers", json::array())) SPARROW_RETURN_IF_ERROR(parse_normalizer(s));
    return Status::ok();
  }
  return Status::unsupported("normalizer '" + type + "' is not supported (only none or an empty Sequence)");
}

Expected<std::shared_ptr<const Regex>> split_pattern(const json& pattern) {
  if (pattern.contains("Regex")) {
    SPARROW_ASSIGN_OR_RETURN(Regex r, Regex::compile(pattern["Regex"].get<std::string>()));
    return std::make_shared<const Regex>(std::move(r));
  }
  if (pattern.contains("String")) {
    SPARROW_ASSIGN_OR_RETURN(Regex r, Regex::literal(pattern["String"].get<std::string>()));
    return std::make_shared<const Regex>(std::move(r));
  }
  return Status::corrupt("Split pattern has neither 'Regex' nor 'String'");
}

Expected<SplitBehavior> split_behavior(const std::string& b) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Status::corrupt("unknown Split behavior '" + b + "'");
}

Status parse_pre_tokenizer(const json& p, std::vector<PreTokenizerStep>& steps, bool& byte_level) {
  if (p.is_null()) return Status::ok();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& s : p.value("pretokenizers", json::array()))
      SPARROW_RETURN_IF_ERROR(parse_pre_tokenizer(s, steps, byte_level));
    return Status::ok();
  }
  if (type == "Split") {
    PreTokenizerStep s;
    SPARROW_ASSIGN_OR_RETURN(s.regex, split_pattern(p.value("pattern", json::object())));
    SPARROW_ASSIGN_OR_RETURN(s.behavior, split_behavior(p.value("behavior", "Isolated")));
    s.invert = p.value("invert", false);
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    byte_level = true;
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::kByteLevel;
    s.add_prefix_space = p.value("add_prefix_space", true);
    steps.push_back(s);
    if (p.value("use_regex", true)) {
      PreTokenizerStep r;
      SPARROW_ASSIGN_OR_RETURN(Regex re, Regex::compile(kGpt2Pattern));
      r.regex = std::make_shared<const Regex>(std::move(re));
      r.behavior = SplitBehavior::kIsolated;
      steps.push_back(std::move(r));
    }
    return Status::ok();
  }
  if (type == "Digits") {
    PreTokenizerStep s;
    SPARROW_ASSIGN_OR_RETURN(Regex re, Regex::compile("\\p{N}"));
    s.regex = std::make_shared<const Regex>(std::move(re));
    s.behavior = p.value("individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
    steps.push_back(std::move(s));
    return Status::ok();
  }
  return Status::unsupported("pre-tokenizer '" + type + "' is not supported (Sequence, Split, ByteLevel, Digits are)");
}

Status check_decoder(const json& d) {
  if (d.is_null()) return Status::ok();
  const std::string type = d.value("type", "");
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence") {
    for (const json& s : d.value("decoders", json::array())) SPARROW_RETURN_IF_ERROR(check_decoder(s));
    return Status::ok();
  }
  return Status::unsupported("decoder '" + type + "' is not supported (only ByteLevel)");
}

}  // namespace

Expected<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = path / "tokenizer.json";
  if (!std::filesystem::exists(file, ec))
    return Status::not_found(file.string() + " does not exist" +
                             (file == path ? "" : " (the directory has no tokenizer.json; pass --tokenizer FILE)"));
  SPARROW_ASSIGN_OR_RETURN(std::string text, read_file(file));
  std::string config;
  const std::filesystem::path cfg = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg, ec)) {
    SPARROW_ASSIGN_OR_RETURN(config, read_file(cfg));
  }
  auto tok = from_json(text, config, file.string());
  if (!tok.is_ok()) return tok.status();
  return tok;
}

Expected<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                                         const std::string& source) {
  auto fail = [&](const Status& s) { return s.with_context(source); };
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return fail(Status::corrupt("not a JSON object"));
  json cfg = json::object();
  if (!config_json.empty()) {
    cfg = json::parse(config_json, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) return fail(Status::corrupt("tokenizer_config.json is not a JSON object"));
  }
  try {
    auto impl = std::make_unique<Impl>();
    if (Status s = parse_normalizer(j.value("normalizer", json())); !s.is_ok()) return fail(s);
    std::vector<PreTokenizerStep> steps;
    bool byte_level = false;
    if (Status s = parse_pre_tokenizer(j.value("pre_tokenizer", json()), steps, byte_level); !s.is_ok()) return fail(s);
    if (!byte_level)
      return fail(Status::unsupported("only byte-level BPE is supported (the pre-tokenizer has no ByteLevel step)"));
    impl->pre = PreTokenizer(std::move(steps));
    if (Status s = check_decoder(j.value("decoder", json())); !s.is_ok()) return fail(s);

    const json& model = j.at("model");
    const std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE") return fail(Status::unsupported("model type '" + mtype + "' is not supported (only BPE)"));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
        return fail(Status::unsupported(std::string("BPE ") + key + " is not supported"));
    if (model.contains("dropout") && !model["dropout"].is_null())
      return fail(Status::unsupported("BPE dropout is not supported for inference"));
    if (model.value("byte_fallback", false)) return fail(Status::unsupported("BPE byte_fallback is not supported"));

    std::vector<std::pair<std::string, int32_t>> vocab;
    vocab.reserve(model.at("vocab").size());
    for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it)
      vocab.emplace_back(it.key(), it.value().get<int32_t>());
    std::vector<std::pair<std::string, std::string>> merges;
    const json& jm = model.value("merges", json::array());
    merges.reserve(jm.size());
    for (const json& m : jm) {
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return fail(Status::corrupt("merge '" + s + "' is not two tokens separated by one space"));
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return fail(Status::corrupt("a merge is neither \"a b\" nor [a, b]: " + m.dump()));
      }
    }
    BpeOptions bo;
    if (model.contains("unk_token") && model["unk_token"].is_string()) bo.unk_token = model["unk_token"].get<std::string>();
    bo.fuse_unk = model.value("fuse_unk", false);
    bo.ignore_merges = model.value("ignore_merges", false);
    auto bpe = BpeModel::build(std::move(vocab), merges, bo);
    if (!bpe.is_ok()) return fail(bpe.status());
    impl->bpe = std::move(bpe).value();

    int32_t limit = impl->bpe.id_limit();
    for (const json& a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.id = a.at("id").get<int32_t>();
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.normalized = a.value("normalized", !t.special);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      if (t.content.empty()) return fail(Status::corrupt("added token " + std::to_string(t.id) + " is empty"));
      if (t.id < 0) return fail(Status::corrupt("added token '" + t.content + "' has a negative id"));
      if (utf8_find_invalid(t.content)) return fail(Status::corrupt("added token " + std::to_string(t.id) + " is not UTF-8"));
      if (a.value("single_word", false))
        return fail(Status::unsupported("added token '" + t.content + "' has single_word=true"));
      limit = std::max(limit, t.id + 1);
      impl->added_ids[t.content] = t.id;
      impl->added.push_back(std::move(t));
    }
    for (size_t i = 0; i < impl->added.size(); ++i) {
      const AddedToken& t = impl->added[i];
      (t.normalized ? impl->normalized_matcher : impl->raw_matcher).add(t.content, static_cast<int32_t>(i));
    }

    Tokenizer tok(std::move(impl));
    Impl& im = *tok.impl_;
    tok.bytes_.assign(static_cast<size_t>(limit), std::string());
    im.special.assign(static_cast<size_t>(limit), false);
    for (int32_t id = 0; id < im.bpe.id_limit(); ++id) {
      const std::string* t = im.bpe.token(id);
      if (!t) continue;
      // Every character through the GPT-2 table; a token with a character outside the table
      // decodes to its own UTF-8 (what Hugging Face's ByteLevel decoder does).
      std::string bytes;
      bool ok = true;
      for (size_t i = 0; i < t->size();) {
        const size_t len = utf8_sequence_length(*t, i);
        if (len == 0) {
          ok = false;
          break;
        }
        const int b = byte_level_byte(decode_at(*t, i, len));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
        i += len;
      }
      tok.bytes_[id] = ok ? bytes : *t;
    }
    for (const AddedToken& t : im.added) {
      tok.bytes_[t.id] = t.content;
      im.special[t.id] = t.special;
    }

    im.add_bos = cfg.value("add_bos_token", false);
    im.add_eos = cfg.value("add_eos_token", false);
    if (auto s = config_token(cfg, "bos_token")) {
      im.bos = tok.token_to_id(*s);
      if (!im.bos) return fail(Status::corrupt("bos_token '" + *s + "' of tokenizer_config.json is not a token"));
    }
    if (auto s = config_token(cfg, "eos_token")) {
      im.eos = tok.token_to_id(*s);
      if (!im.eos) return fail(Status::corrupt("eos_token '" + *s + "' of tokenizer_config.json is not a token"));
    }
    if (im.add_bos && !im.bos) return fail(Status::corrupt("add_bos_token is true but there is no bos_token"));
    if (im.add_eos && !im.eos) return fail(Status::corrupt("add_eos_token is true but there is no eos_token"));
    return tok;
  } catch (const json::exception& e) {
    return fail(Status::corrupt(std::string("unexpected structure: ") + e.what()));
  }
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(std::string(token)); it != impl_->added_ids.end()) return it->second;
  return impl_->bpe.id_of(token);
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }
bool Tokenizer::add_eos_token() const { return impl_->add_eos; }

bool Tokenizer::is_known(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return impl_->special[id] || !bytes_[id].empty() || impl_->bpe.token(id) != nullptr;
}
bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && impl_->special[id]; }
std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return bytes_[id];
}

Status Tokenizer::encode_section(std::string_view text, std::vector<int32_t>& out) const {
  thread_local PreTokenizeScratch scratch;
  scratch.clear();
  SPARROW_ASSIGN_OR_RETURN(const std::vector<std::string_view>* pieces, impl_->pre.run(text, scratch));
  PieceCache& cache = *impl_->cache;
  for (std::string_view p : *pieces) {
    if (p.size() > PieceCache::kMaxPieceBytes) {
      impl_->bpe.encode_piece(p, out);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(cache.mu);
      auto it = cache.map.find(p);
      if (it != cache.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const size_t start = out.size();
    impl_->bpe.encode_piece(p, out);
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.map.size() >= PieceCache::kMaxEntries) cache.map.clear();
    cache.map.emplace(std::string(p), std::vector<int32_t>(out.begin() + start, out.end()));
  }
  return Status::ok();
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (auto bad = utf8_find_invalid(text))
    return Status::invalid_argument("text is not valid UTF-8 (byte " + std::to_string(*bad) + ")");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens && impl_->add_bos) out.push_back(*impl_->bos);

  // Pass 2 (normalized=true tokens) over one section the raw pass left, then BPE for the rest.
  auto encode_normalized = [&](std::string_view sec) -> Status {
    size_t pos = 0;
    while (pos < sec.size()) {
      std::optional<AddedTokenMatcher::Hit> hit;
      if (!impl_->normalized_matcher.empty()) hit = impl_->normalized_matcher.find(sec, pos);
      size_t b = hit ? hit->begin : sec.size(), e = hit ? hit->end : sec.size();
      if (hit) {
        const AddedToken& t = impl_->added[hit->token];
        if (t.lstrip)
          while (size_t n = white_space_before(sec, b)) {
            if (b - n < pos) break;
            b -= n;
          }
        if (t.rstrip)
          while (size_t n = white_space_at(sec, e)) e += n;
      }
      if (b > pos) SPARROW_RETURN_IF_ERROR(encode_section(sec.substr(pos, b - pos), out));
      if (!hit) break;
      out.push_back(impl_->added[hit->token].id);
      pos = e;
    }
    return Status::ok();
  };

  // Pass 1: normalized=false tokens over the raw text.
  size_t pos = 0;
  while (pos < text.size()) {
    std::optional<AddedTokenMatcher::Hit> hit;
    if (!impl_->raw_matcher.empty()) hit = impl_->raw_matcher.find(text, pos);
    size_t b = hit ? hit->begin : text.size(), e = hit ? hit->end : text.size();
    if (hit) {
      const AddedToken& t = impl_->added[hit->token];
      if (t.lstrip)
        while (size_t n = white_space_before(text, b)) {
          if (b - n < pos) break;
          b -= n;
        }
      if (t.rstrip)
        while (size_t n = white_space_at(text, e)) e += n;
    }
    if (b > pos) SPARROW_RETURN_IF_ERROR(encode_normalized(text.substr(pos, b - pos)));
    if (!hit) break;
    out.push_back(impl_->added[hit->token].id);
    pos = e;
  }
  if (add_special_tokens && impl_->add_eos) out.push_back(*impl_->eos);
  return out;
}

Expected<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (!is_known(id))
      return Status::invalid_argument("token id " + std::to_string(id) + " at position " + std::to_string(i) +
                                      " is not in the tokenizer's vocabulary");
    if (skip_special_tokens && impl_->special[id]) continue;
    bytes += bytes_[id];
  }
  return utf8_repair(bytes);
}

std::string StreamDecoder::push(int32_t id) {
  if (!tok_.is_known(id) || (skip_special_ && tok_.is_special(id))) return {};
  pending_ += tok_.token_bytes(id);
  const size_t cut = utf8_complete_prefix(pending_);
  std::string out = utf8_repair(std::string_view(pending_).substr(0, cut));
  pending_.erase(0, cut);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace sparrow
