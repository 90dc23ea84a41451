// python_side.h: the same DeMo in Python PyTorch (reference_demo.py, run by /usr/bin/python3 as a
// child process) on the model's parameter shapes, and what it measured.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agora/optim/strategy.h"
#include "measure.h"

namespace agora::bench {

struct PythonFigures {
  double compress = 0;                  // seconds, median
  std::map<int64_t, double> aggregate;  // by peer count
  double adamw = 0;
  nlohmann::json report;  // everything the script wrote
};

// Writes the parameters' names and shapes to a temporary JSON file, runs the script for one DeMo
// configuration with the options' peers, repeats and threads (its own output goes to our stderr),
// and reads its JSON. Throws Error when it fails or its report lacks a figure.
PythonFigures run_python(const Options& o, const std::vector<NamedParameter>& params,
                         const DemoConfig& config, const std::vector<int64_t>& peers);

}  // namespace agora::bench
