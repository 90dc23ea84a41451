// bench_tokenize: GPT-2 encoding speed of agora's tokenizer, on one thread and on many, beside
// tiktoken (npm, WASM) on one thread, over the same corpus in the same run.
//
// Each measurement repeats (--repeats) and reports the median, min and max MB/s (MB = 10^6
// bytes of input text). The ratio is agora's median over tiktoken's median. The token counts of
// the two implementations must agree; a mismatch is printed loudly and fails the run.
#include <stdio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/gpt2_tokenizer.h"

namespace fs = std::filesystem;
using agora::TokenId;

namespace {

struct Figures {
  std::string implementation;
  unsigned threads = 1;
  std::vector<double> mb_per_s;
  uint64_t tokens = 0;

  double median() const {
    std::vector<double> v = mb_per_s;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  double min() const { return *std::min_element(mb_per_s.begin(), mb_per_s.end()); }
  double max() const { return *std::max_element(mb_per_s.begin(), mb_per_s.end()); }
};

struct Corpus {
  std::vector<fs::path> paths;
  std::vector<std::string> texts;
  uint64_t bytes = 0;
};

Corpus load_corpus(const fs::path& dir) {
  if (!fs::is_directory(dir)) {
    agora::fail("corpus folder {} is missing: run scripts/setup.sh, or pass --corpus DIR",
                dir.string());
  }
  Corpus corpus;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") {
      corpus.paths.push_back(entry.path());
    }
  }
  if (corpus.paths.empty()) agora::fail("corpus folder {} has no .txt files", dir.string());
  std::sort(corpus.paths.begin(), corpus.paths.end());
  for (const fs::path& p : corpus.paths) {
    corpus.texts.push_back(agora::read_file(p));
    corpus.bytes += corpus.texts.back().size();
  }
  return corpus;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One pass over the corpus with `threads` threads, each taking the next document from a shared
// counter (largest first, so one long document does not finish last). Returns the token count.
uint64_t encode_all(const agora::Tokenizer& tokenizer, const Corpus& corpus,
                    const std::vector<size_t>& order, unsigned threads) {
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> tokens{0};
  auto work = [&] {
    std::vector<TokenId> ids;
    uint64_t mine = 0;
    for (size_t i; (i = next.fetch_add(1)) < order.size();) {
      ids.clear();
      tokenizer.encode(corpus.texts[order[i]], ids);
      mine += ids.size();
    }
    tokens += mine;
  };
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  return tokens;
}

Figures measure_agora(const agora::Tokenizer& tokenizer, const Corpus& corpus, unsigned threads,
                      int repeats) {
  std::vector<size_t> order(corpus.texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return corpus.texts[a].size() > corpus.texts[b].size(); });
  Figures f{"agora", threads, {}, 0};
  f.tokens = encode_all(tokenizer, corpus, order, threads);  // warm-up
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    encode_all(tokenizer, corpus, order, threads);
    f.mb_per_s.push_back(static_cast<double>(corpus.bytes) / 1e6 / seconds_since(start));
  }
  return f;
}

Figures measure_tiktoken(const Corpus& corpus, const std::string& node, int repeats) {
  const fs::path list =
      fs::temp_directory_path() / ("agora_bench_tokenize_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(list);
    for (const fs::path& p : corpus.paths) out << p.string() << '\n';
  }
  const std::string command = node + " '" AGORA_SOURCE_DIR "/bench/tokenize/tiktoken_bench.mjs' " +
                              "--tiktoken '" AGORA_DEPS_DIR "/node_modules/tiktoken' --repeats " +
                              std::to_string(repeats) + " --list '" + list.string() + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) agora::fail("cannot run {}", command);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  fs::remove(list);
  if (status != 0) {
    agora::fail(
        "tiktoken benchmark failed (status {}): {} (needs node and deps/node_modules/"
        "tiktoken: run scripts/setup.sh, or pass --no-tiktoken)",
        status, command);
  }
  const nlohmann::json result = nlohmann::json::parse(output);
  Figures f{"tiktoken (npm, WASM)", 1, {}, result.at("tokens").get<uint64_t>()};
  for (double s : result.at("seconds")) {
    f.mb_per_s.push_back(static_cast<double>(corpus.bytes) / 1e6 / s);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 tokenizer throughput: agora against tiktoken on the bundled corpus"};
  std::string corpus_dir = AGORA_DATA_DIR "/corpus";
  std::string gpt2_dir = agora::default_gpt2_dir().string();
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  int repeats = 5;
  std::string json_path;
  std::string node = "node";
  bool no_tiktoken = false;
  app.add_option("--corpus", corpus_dir, "Folder of .txt documents (searched recursively)");
  app.add_option("--gpt2-dir", gpt2_dir, "Folder with encoder.json and vocab.bpe");
  app.add_option("--threads", threads, "Threads for the parallel measurement")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "Timed passes per measurement")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "Write the figures to this JSON file");
  app.add_option("--node", node, "The node executable");
  app.add_flag("--no-tiktoken", no_tiktoken, "Skip the tiktoken measurement");
  CLI11_PARSE(app, argc, argv);

  try {
    const Corpus corpus = load_corpus(corpus_dir);
    const auto load_start = std::chrono::steady_clock::now();
    const auto gpt2 = agora::Gpt2Tokenizer::load(gpt2_dir);
    const double load_ms = seconds_since(load_start) * 1e3;
    std::cout << "corpus " << corpus_dir << ": " << corpus.texts.size() << " documents, "
              << corpus.bytes << " bytes; tokenizer loaded in " << static_cast<int>(load_ms)
              << " ms; " << repeats << " repeats, medians\n\n";

    std::vector<Figures> rows;
    rows.push_back(measure_agora(*gpt2, corpus, 1, repeats));
    if (threads > 1) rows.push_back(measure_agora(*gpt2, corpus, threads, repeats));
    const Figures* reference = nullptr;
    if (!no_tiktoken) {
      rows.push_back(measure_tiktoken(corpus, node, repeats));
      reference = &rows.back();
    }

    std::cout << fmt::format("{:<22} {:>7} {:>10} {:>9} {:>9} {:>10} {:>12}\n", "implementation",
                             "threads", "MB/s", "min", "max", "tokens", "vs tiktoken");
    for (const Figures& f : rows) {
      const std::string ratio =
          reference ? fmt::format("{:.2f}x", f.median() / reference->median()) : "-";
      std::cout << fmt::format("{:<22} {:>7} {:>10.2f} {:>9.2f} {:>9.2f} {:>10} {:>12}\n",
                               f.implementation, f.threads, f.median(), f.min(), f.max(), f.tokens,
                               ratio);
    }

    bool agree = true;
    if (reference != nullptr && reference->tokens != rows[0].tokens) {
      agree = false;
      std::cout << "\n!!!!! TOKEN COUNT MISMATCH: agora " << rows[0].tokens << ", tiktoken "
                << reference->tokens << " -- the tokenizers disagree on this corpus "
                << "(run gpt2_parity_test to find where) !!!!!\n";
    }

    if (!json_path.empty()) {
      nlohmann::json out;
      out["benchmark"] = "tokenize";
      out["nproc"] = std::thread::hardware_concurrency();
      out["corpus"] = corpus_dir;
      out["documents"] = corpus.texts.size();
      out["corpus_bytes"] = corpus.bytes;
      out["repeats"] = repeats;
      out["tokenizer_load_ms"] = load_ms;
      out["tokens_agree"] = agree;
      for (const Figures& f : rows) {
        nlohmann::json row = {{"implementation", f.implementation},
                              {"threads", f.threads},
                              {"mb_per_s_median", f.median()},
                              {"mb_per_s_min", f.min()},
                              {"mb_per_s_max", f.max()},
                              {"mb_per_s", f.mb_per_s},
                              {"tokens", f.tokens}};
        if (reference != nullptr) row["ratio_vs_tiktoken"] = f.median() / reference->median();
        out["results"].push_back(row);
      }
      if (reference != nullptr) out["ratio"] = rows[0].median() / reference->median();
      const std::filesystem::path json_file(json_path);
      if (json_file.has_parent_path()) std::filesystem::create_directories(json_file.parent_path());
      agora::write_file_atomic(json_file, out.dump(2) + "\n");
    }
    return agree ? 0 : 1;
  } catch (const agora::Error& e) {
    std::cerr << "bench_tokenize: " << e.what() << "\n";
    return 1;
  }
}
