#include "metrics/testing/exposition_parser.h"

#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zcc::metrics::testing {
namespace {

bool IsNameChar(char c, bool first, bool colon_ok) {
  return absl::ascii_isalpha(c) || c == '_' || (colon_ok && c == ':') ||
         (!first && absl::ascii_isdigit(c));
}

// Consumes a metric (colon_ok) or label name from the front of `s`.
bool ConsumeName(absl::string_view& s, bool colon_ok, std::string* name) {
  size_t n = 0;
  while (n < s.size() && IsNameChar(s[n], n == 0, colon_ok)) ++n;
  if (n == 0) return false;
  *name = std::string(s.substr(0, n));
  s.remove_prefix(n);
  return true;
}

// Unescapes a HELP text (\\ and \n) or, with `quote_ok`, a label value (also \").
bool Unescape(absl::string_view s, bool quote_ok, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      if (s[i] == '\n') return false;
      out->push_back(s[i]);
      continue;
    }
    if (++i == s.size()) return false;
    if (s[i] == '\\') {
      out->push_back('\\');
    } else if (s[i] == 'n') {
      out->push_back('\n');
    } else if (s[i] == '"' && quote_ok) {
      out->push_back('"');
    } else {
      return false;
    }
  }
  return true;
}

bool ParseFloat(absl::string_view s, double* v) {
  if (s == "NaN") {
    *v = std::nan("");
    return true;
  }
  if (s == "+Inf" || s == "Inf") {
    *v = HUGE_VAL;
    return true;
  }
  if (s == "-Inf") {
    *v = -HUGE_VAL;
    return true;
  }
  if (s.empty() || s.find_first_not_of("0123456789+-.eE") != absl::string_view::npos) return false;
  const std::string copy(s);
  char* end = nullptr;
  *v = std::strtod(copy.c_str(), &end);
  return end == copy.c_str() + copy.size();
}

// {a="x",b="y"} from the front of `s` (which starts with '{').
bool ConsumeLabels(absl::string_view& s, LabelMap* labels, std::string* why) {
  s.remove_prefix(1);
  while (true) {
    if (absl::ConsumePrefix(&s, "}")) return true;
    std::string name;
    if (!ConsumeName(s, false, &name)) {
      *why = "bad label name";
      return false;
    }
    if (!absl::ConsumePrefix(&s, "=\"")) {
      *why = absl::StrCat("expected =\" after label ", name);
      return false;
    }
    size_t end = 0;
    while (end < s.size() && s[end] != '"') end += s[end] == '\\' ? 2 : 1;
    if (end >= s.size()) {
      *why = absl::StrCat("unterminated value of label ", name);
      return false;
    }
    std::string value;
    if (!Unescape(s.substr(0, end), true, &value)) {
      *why = absl::StrCat("bad escape in value of label ", name);
      return false;
    }
    if (!labels->emplace(name, value).second) {
      *why = absl::StrCat("label ", name, " repeated");
      return false;
    }
    s.remove_prefix(end + 1);
    if (!absl::ConsumePrefix(&s, ",") && !absl::StartsWith(s, "}")) {
      *why = "expected , or } after a label";
      return false;
    }
  }
}

std::string SeriesKey(const std::string& name, const LabelMap& labels) {
  std::string key = name;
  for (const auto& [k, v] : labels) absl::StrAppend(&key, "\x01", k, "\x02", v);
  return key;
}

struct HistogramSeries {
  std::vector<std::pair<double, double>> buckets;  // (le, count) in order
  std::optional<double> count;
  bool has_sum = false;
  int line = 0;
};

}  // namespace

std::optional<double> Exposition::Value(absl::string_view name, const LabelMap& labels) const {
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

absl::StatusOr<Exposition> ParseExposition(absl::string_view text) {
  auto error = [](int line, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", why));
  };
  if (!text.empty() && text.back() != '\n') return error(0, "text must end with a newline");
  Exposition out;
  std::set<std::string> finished;  // families whose samples are over
  std::string current;
  std::set<std::string> series_seen;
  std::map<std::string, std::set<std::string>> sampled;  // families with samples
  std::map<std::string, HistogramSeries> histograms;     // family + labels (no le)
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      absl::string_view rest = line.substr(1);
      const bool help = absl::ConsumePrefix(&rest, " HELP ");
      const bool type = !help && absl::ConsumePrefix(&rest, " TYPE ");
      if (!help && !type) continue;  // a plain comment
      std::string name;
      if (!ConsumeName(rest, true, &name)) return error(line_no, "bad metric name");
      if (help) {
        if (!rest.empty() && !absl::ConsumePrefix(&rest, " ")) return error(line_no, "bad HELP");
        std::string doc;
        if (!Unescape(rest, false, &doc)) return error(line_no, "bad escape in HELP");
        if (!out.helps.emplace(name, doc).second) return error(line_no, "second HELP for " + name);
      } else {
        if (!absl::ConsumePrefix(&rest, " ")) return error(line_no, "TYPE without a type");
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                     "untyped"};
        if (kTypes.count(std::string(rest)) == 0) return error(line_no, "unknown type");
        if (sampled.count(name) != 0) return error(line_no, "TYPE after samples of " + name);
        if (!out.types.emplace(name, std::string(rest)).second) {
          return error(line_no, "second TYPE for " + name);
        }
      }
      continue;
    }

    Sample sample;
    absl::string_view rest = line;
    if (!ConsumeName(rest, true, &sample.name)) return error(line_no, "bad metric name");
    if (absl::StartsWith(rest, "{")) {
      std::string why;
      if (!ConsumeLabels(rest, &sample.labels, &why)) return error(line_no, why);
    }
    if (!absl::ConsumePrefix(&rest, " ")) return error(line_no, "expected a space before the value");
    std::vector<absl::string_view> fields = absl::StrSplit(rest, ' ');
    if (fields.size() > 2) return error(line_no, "trailing text after the timestamp");
    if (!ParseFloat(fields[0], &sample.value)) return error(line_no, "bad value");
    int64_t timestamp = 0;
    if (fields.size() == 2 && !absl::SimpleAtoi(fields[1], &timestamp)) {
      return error(line_no, "bad timestamp");
    }

    // The family: the name, or for histogram samples the name without suffix.
    std::string family = sample.name;
    std::string suffix;
    for (absl::string_view s : {"_bucket", "_sum", "_count"}) {
      if (absl::EndsWith(sample.name, s)) {
        const std::string base = sample.name.substr(0, sample.name.size() - s.size());
        auto it = out.types.find(base);
        if (it != out.types.end() && it->second == "histogram") {
          family = base;
          suffix = std::string(s);
        }
      }
    }
    auto type = out.types.find(family);
    if (type == out.types.end()) return error(line_no, "sample without a TYPE: " + sample.name);
    if (type->second == "histogram") {
      if (suffix.empty()) return error(line_no, "histogram sample without suffix");
      if ((suffix == "_bucket") != (sample.labels.count("le") == 1)) {
        return error(line_no, "le belongs on _bucket samples, and only there");
      }
    } else if (!suffix.empty() || family != sample.name) {
      return error(line_no, "sample name does not fit its family");
    }
    if (family != current) {
      if (finished.count(family) != 0) return error(line_no, "samples of " + family + " split up");
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    sampled[family];
    if (!series_seen.insert(SeriesKey(sample.name, sample.labels)).second) {
      return error(line_no, "duplicate series " + sample.name);
    }
    if (type->second == "histogram") {
      LabelMap base_labels = sample.labels;
      base_labels.erase("le");
      HistogramSeries& h = histograms[SeriesKey(family, base_labels)];
      h.line = line_no;
      if (suffix == "_bucket") {
        double le = 0;
        if (!ParseFloat(sample.labels.at("le"), &le) || std::isnan(le)) {
          return error(line_no, "bad le");
        }
        if (h.count.has_value()) return error(line_no, "bucket after _count");
        if (!h.buckets.empty() &&
            (le <= h.buckets.back().first || sample.value < h.buckets.back().second)) {
          return error(line_no, "buckets must have increasing le and cumulative counts");
        }
        h.buckets.emplace_back(le, sample.value);
      } else if (suffix == "_sum") {
        h.has_sum = true;
      } else {
        h.count = sample.value;
      }
    } else if (type->second == "counter" && sample.value < 0) {
      return error(line_no, "negative counter");
    }
    out.samples.push_back(std::move(sample));
  }
  for (const auto& [key, h] : histograms) {
    if (h.buckets.empty() || !std::isinf(h.buckets.back().first)) {
      return error(h.line, "histogram without a +Inf bucket");
    }
    if (!h.count.has_value() || !h.has_sum) return error(h.line, "histogram without _sum/_count");
    if (*h.count != h.buckets.back().second) return error(h.line, "+Inf bucket != _count");
  }
  return out;
}

}  // namespace zcc::metrics::testing
