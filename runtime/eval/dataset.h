#pragma once
// Evaluation datasets as rows a workflow can run on: the MATH files (gold = `answer`, else the last \boxed{}
// of `solution`), LongBench's jsonl schema, the CacheBlend MuSiQue sample (one JSON list) and plain jsonl.
// Bad data — a malformed line, a missing field, an empty file — is an InputError naming file:line.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/eval/metric.h"

namespace choreo::eval {

/// How a data file is read.
enum class DataFormat { math, longbench, musique, jsonl };

/// "math", "longbench", "musique", "jsonl".
std::string_view format_name(DataFormat format);
/// The format called `name`; InputError otherwise.
DataFormat parse_format(std::string_view name);
/// The format a file's contents show: a JSON list of objects with ctxs -> musique; jsonl with
/// problem+answer or problem+solution -> math; input+context+answers -> longbench; else jsonl.
DataFormat detect_format(const std::string& path);

/// One dataset row: what a workflow reads (fields), what it is scored against, and what reports group by.
struct Row {
  std::string id;                             // unique in the file
  int line = 0;                               // where the row starts in its file (1-based)
  std::map<std::string, std::string> fields;  // workflow inputs by name (docs/eval.md lists them per format)
  std::vector<std::string> gold;              // gold answers
  std::vector<std::string> all_classes;       // LongBench classification labels, else empty
  std::string dataset;                        // LongBench's dataset name ("musique" for the CacheBlend file)
  std::string subject;                        // MATH subject (`subject` or `type`), else empty
  std::string level;                          // MATH level as a number ("Level 3" -> "3"), else empty
};

/// A loaded file: its rows in file order and the metric its rows call for.
struct Dataset {
  std::string path;
  DataFormat format = DataFormat::jsonl;
  std::vector<Row> rows;
  std::optional<Metric> metric;  // math for MATH, LongBench's metric for its dataset, qa_f1 for musique
};

/// Reads `path` in `format` (detect_format when nullopt). Row ids must be unique.
Dataset load_dataset(const std::string& path, std::optional<DataFormat> format = std::nullopt);

}  // namespace choreo::eval
