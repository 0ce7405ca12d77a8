// llmc/core/input_safety.cpp: the checked JSON parser (a SAX handler that builds the document itself, so that depth,
// duplicate keys and number overflows are seen while parsing, with the line they are on), the regular-file checks and
// the checked arithmetic declared in input_safety.h.
#include "llmc/core/input_safety.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/file_io.h"

namespace llmc {

using json = nlohmann::json;

namespace {

// ----------------------------------------------------------------------------------------------------------------
// JSON

// A forward iterator over the text that records how far the parser has read (*furthest), so that SAX events, which
// carry no position, can name their line.
class TrackedChars {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedChars() = default;
  TrackedChars(const char* p, const char** furthest) : p_(p), furthest_(furthest) {}
  reference operator*() const { return *p_; }
  TrackedChars& operator++() {
    ++p_;
    if (furthest_ && p_ > *furthest_) *furthest_ = p_;
    return *this;
  }
  TrackedChars operator++(int) {
    TrackedChars before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedChars& other) const { return p_ == other.p_; }
  bool operator!=(const TrackedChars& other) const { return p_ != other.p_; }

 private:
  const char* p_ = nullptr;
  const char** furthest_ = nullptr;
};

// Builds the document like nlohmann's own DOM parser, and stops (returning false) at the first nesting deeper than
// the limit or duplicate key; a syntax error or number overflow arrives through parse_error. *error receives the
// message (without the source) and *kind what went wrong.
class CheckedDomBuilder : public nlohmann::json_sax<json> {
 public:
  CheckedDomBuilder(json* root, const JsonReadOptions& options, const char* begin, const char* end,
                    const char* const* furthest, std::string* error, JsonError::Kind* kind)
      : root_(root), options_(options), begin_(begin), one_line_(std::find(begin, end, '\n') == end),
        furthest_(furthest), error_(error), kind_(kind) {}

  bool null() override { return put(json(nullptr)); }
  bool boolean(bool v) override { return put(json(v)); }
  bool number_integer(number_integer_t v) override { return put(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) override { return put(json(v)); }
  bool string(string_t& v) override { return put(json(std::move(v))); }
  bool binary(binary_t& v) override { return put(json::binary(std::move(v))); }

  bool start_object(std::size_t /*elements*/) override { return open(json::object()); }
  bool start_array(std::size_t /*elements*/) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    json& object = *stack_.back();
    if (options_.reject_duplicate_keys && object.contains(k)) {
      *error_ = strformat("duplicate key '%s'%s", path_with(k).c_str(), at_line(*furthest_).c_str());
      *kind_ = JsonError::Kind::DuplicateKey;
      return false;
    }
    key_ = k;
    element_ = &object[k];
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) override {
    if (ex.id == 406) {  // out_of_range.406: a number that does not fit a double
      const std::string where = stack_.empty() ? "" : " of '" + current_path() + "'";
      *error_ = strformat("the number %s%s%s does not fit a 64-bit float", last_token.c_str(), where.c_str(),
                          at_line(begin_ + std::min(position, static_cast<std::size_t>(*furthest_ - begin_))).c_str());
      *kind_ = JsonError::Kind::NumberOverflow;
      return false;
    }
    std::string what = ex.what();
    const size_t bracket = what.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] " prefix
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    *error_ = "invalid JSON: " + what;
    *kind_ = JsonError::Kind::Syntax;
    return false;
  }

 private:
  // " (line N)" for the text position p, "" for text of one line.
  std::string at_line(const char* p) const {
    return one_line_ ? "" : strformat(" (line %zu)", 1 + static_cast<size_t>(std::count(begin_, p, '\n')));
  }

  // The path of the value being read: the keys and array positions from the root.
  std::string current_path() const {
    if (stack_.empty()) return "";
    const json& top = *stack_.back();
    return top.is_array() ? path_with("[" + std::to_string(top.size()) + "]") : path_with(key_);
  }
  std::string path_with(const std::string& last) const {
    std::string out;
    auto append = [&out](const std::string& part) {
      if (part.empty()) return;
      if (part[0] != '[' && !out.empty()) out += '.';
      out += part;
    };
    for (const std::string& name : names_) append(name);
    append(last);
    return out;
  }

  // Stores v where the parser is (the root, the next array element or the value of the last key); returns where.
  json* place(json&& v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    *element_ = std::move(v);
    return element_;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& container) {
    if (static_cast<int>(stack_.size()) >= options_.max_depth) {
      const std::string where = current_path();
      *error_ = strformat("JSON nested deeper than %d levels%s%s", options_.max_depth, at_line(*furthest_).c_str(),
                          where.empty() ? "" : (" at '" + truncated(where) + "'").c_str());
      *kind_ = JsonError::Kind::TooDeep;
      return false;
    }
    std::string name = stack_.empty() ? "" : (stack_.back()->is_array()
                                                  ? "[" + std::to_string(stack_.back()->size()) + "]"
                                                  : key_);
    stack_.push_back(place(std::move(container)));
    names_.push_back(std::move(name));
    return true;
  }
  bool close() {
    stack_.pop_back();
    names_.pop_back();
    return true;
  }
  static std::string truncated(const std::string& s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; }

  json* root_;
  const JsonReadOptions& options_;
  const char* begin_;
  bool one_line_;
  const char* const* furthest_;
  std::string* error_;
  JsonError::Kind* kind_;
  std::vector<json*> stack_;        // the open containers, outermost first
  std::vector<std::string> names_;  // (stack_.size(),) the key or [i] each container has in its parent ("" = root)
  std::string key_;                 // the last key read in the innermost object
  json* element_ = nullptr;         // where that key's value goes
};

// ----------------------------------------------------------------------------------------------------------------
// Files

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

[[noreturn]] void not_regular(const std::string& path, const std::string& what, mode_t mode, const std::string& hint) {
  throw_error("%s '%s' is %s, not a regular file%s", what.c_str(), path.c_str(), file_kind(mode), hint.c_str());
}

}  // namespace

json parse_json(const std::string& text, const std::string& source, const JsonReadOptions& options) {
  json root;
  std::string error;
  JsonError::Kind kind = JsonError::Kind::Syntax;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const char* furthest = begin;
  CheckedDomBuilder builder(&root, options, begin, end, &furthest, &error, &kind);
  const bool ok = json::sax_parse(TrackedChars(begin, &furthest), TrackedChars(end, nullptr), &builder,
                                  json::input_format_t::json, /*strict=*/true, options.allow_comments);
  if (!ok || !error.empty())
    throw JsonError(kind, source + ": " + (error.empty() ? std::string("invalid JSON") : error));
  return root;
}

void check_json_depth(const json& j, const std::string& source, int max_depth) {
  std::vector<std::pair<const json*, int>> todo{{&j, 1}};  // (value, depth of the value if it is a container)
  while (!todo.empty()) {
    const auto [value, depth] = todo.back();
    todo.pop_back();
    if (!value->is_structured()) continue;
    if (depth > max_depth)
      throw JsonError(JsonError::Kind::TooDeep, strformat("%s: JSON nested deeper than %d levels", source.c_str(),
                                                          max_depth));
    for (const json& child : *value)
      if (child.is_structured()) todo.emplace_back(&child, depth + 1);
  }
}

void check_regular_file(const std::string& path, const std::string& what, const std::string& hint) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw_error("cannot open %s '%s': %s%s", what.c_str(), path.c_str(), std::strerror(errno), hint.c_str());
  if (!S_ISREG(st.st_mode)) not_regular(path, what, st.st_mode, hint);
}

int open_regular_file(const std::string& path, const std::string& what, uint64_t* size, const std::string& hint) {
  check_regular_file(path, what, hint);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw_error("cannot open %s '%s': %s%s", what.c_str(), path.c_str(), std::strerror(errno), hint.c_str());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_error("cannot open %s '%s': %s", what.c_str(), path.c_str(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(path, what, st.st_mode, hint);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    throw_error("cannot open %s '%s': %s", what.c_str(), path.c_str(), std::strerror(err));
  }
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                              const std::string& hint) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size, hint);
  if (size > max_bytes) {
    ::close(fd);
    throw_error("%s '%s' is %llu bytes, more than the %llu bytes a %s may have%s", what.c_str(), path.c_str(),
                static_cast<unsigned long long>(size), static_cast<unsigned long long>(max_bytes), what.c_str(),
                hint.c_str());
  }
  std::string text(static_cast<size_t>(size), '\0');
  const IoResult r = read_fully(fd, text.data(), text.size());
  ::close(fd);
  if (!r.ok())
    throw_error("cannot read %s '%s': %s", what.c_str(), path.c_str(),
                r.ended ? "the file became shorter while it was read" : r.what());
  return text;
}

json read_json_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                    const JsonReadOptions& options, const std::string& hint) {
  return parse_json(read_regular_file(path, what, max_bytes, hint), path, options);
}

namespace {

template <typename Op>
int64_t checked(int64_t a, int64_t b, const std::string& what, const char* sign, Op op) {
  int64_t r;
  if (op(a, b, &r))
    throw_error("%s = %lld %s %lld does not fit in 64 bits", what.c_str(), static_cast<long long>(a), sign,
                static_cast<long long>(b));
  return r;
}

}  // namespace

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  return checked(a, b, what, "*", [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); });
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  return checked(a, b, what, "+", [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); });
}

int64_t checked_round_up(int64_t a, int64_t m, const std::string& what) {
  if (m < 1) throw_error("%s: cannot round up to a multiple of %lld", what.c_str(), static_cast<long long>(m));
  const int64_t rem = a % m;
  return rem == 0 ? a : checked_add(a, m - rem, what);
}

}  // namespace llmc
