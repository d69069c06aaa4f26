// A strict reader of the Prometheus text exposition format 0.0.4, for tests:
// it checks every line's syntax and the family rules the format implies, and
// returns the samples so a test can check values.
#ifndef ZCC_METRICS_TESTING_EXPOSITION_PARSER_H_
#define ZCC_METRICS_TESTING_EXPOSITION_PARSER_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::metrics::testing {

using LabelMap = std::map<std::string, std::string>;

struct Sample {
  std::string name;  // as written, e.g. "zcc_checkpoint_seconds_bucket"
  LabelMap labels;   // unescaped values
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family -> counter, gauge, ...
  std::map<std::string, std::string> helps;  // family -> unescaped help
  std::vector<Sample> samples;               // in order

  // The value of the sample `name` with exactly `labels`, if present.
  std::optional<double> Value(absl::string_view name, const LabelMap& labels = {}) const;
};

// Checks, besides the syntax of each line (metric and label names, quoted and
// escaped label values, float values, optional integer timestamps): the text
// ends with a newline; HELP and TYPE appear at most once per family and TYPE
// before its samples; a family's samples are contiguous; sample names fit
// their family's type (counter: name; histogram: name_bucket with "le",
// name_sum, name_count); no two samples have the same name and labels; each
// histogram series has cumulative buckets with increasing "le", ending in
// le="+Inf" equal to its _count. InvalidArgument "line N: reason" otherwise.
absl::StatusOr<Exposition> ParseExposition(absl::string_view text);

}  // namespace zcc::metrics::testing

#endif  // ZCC_METRICS_TESTING_EXPOSITION_PARSER_H_
