// An independent check of the safetensors format: Python reads what agora writes and agora reads
// what Python writes, both sides following the published format with nothing but the standard
// library (json, struct) and numpy. When the `safetensors` package happens to be importable, the
// reader script also opens agora's file with it; the test never depends on it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "agora/core/file.h"
#include "agora/tensor/safetensors.h"
#include "safetensors_test_support.h"

namespace agora {
namespace safetensors_test {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

// Shared by both scripts: the test value of element i (see expected_value in C++), the numpy
// type of each dtype, and how BF16 (which numpy lacks) maps to float32.
constexpr const char* kPythonCommon = R"PY(
import json, struct, sys
try:
    import numpy as np
except ImportError:
    print("numpy is missing: install python3-numpy (apt-get install python3-numpy)")
    sys.exit(3)

NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
      "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
SCALE = {"I8": 1, "I16": 100, "I32": 100000, "I64": 10**12}

def value(dtype, count):
    i = np.arange(count, dtype=np.int64)
    if dtype in ("F64", "F32", "F16", "BF16"):
        return (i.astype(np.float64) - 3) * 0.5
    if dtype in SCALE:
        return (i * 37 % 200 - 100) * SCALE[dtype]
    if dtype == "U8":
        return i * 37 % 256
    if dtype == "BOOL":
        return i % 3 == 0
    raise ValueError(dtype)

def to_bytes(dtype, values):
    if dtype == "BF16":
        return (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return values.astype(NP[dtype]).tobytes()

def from_bytes(dtype, raw, shape):
    arr = np.frombuffer(raw, dtype=NP[dtype])
    if dtype == "BF16":
        arr = (arr.astype("<u4") << 16).view("<f4")
    return arr.reshape(shape)

path, specs, metadata = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
)PY";

// Reads agora's file by the format's rules and compares every value.
constexpr const char* kPythonReader = R"PY(
with open(path, "rb") as f:
    data = f.read()
(n,) = struct.unpack("<Q", data[:8])
assert n <= len(data) - 8, f"header length {n} past the end"
assert (8 + n) % 8 == 0, f"data section starts at {8 + n}, not a multiple of 8"
text = data[8:8 + n].decode("utf-8")
assert text.rstrip(" ").endswith("}") and len(text) - len(text.rstrip(" ")) < 8, "bad padding"
header = json.loads(text)
assert header.pop("__metadata__", {}) == metadata, "metadata differs"
assert list(header) == [s[0] for s in specs], f"names or order differ: {list(header)}"
body = data[8 + n:]
end = 0
for begin, stop in sorted(tuple(e["data_offsets"]) for e in header.values()):
    assert begin == end, f"tensors not contiguous at {begin}"
    end = stop
assert end == len(body), f"tensors end at {end}, data section has {len(body)} bytes"
arrays = {}
for name, dtype, shape in specs:
    entry = header[name]
    assert entry["dtype"] == dtype and entry["shape"] == shape, f"{name}: {entry}"
    assert set(entry) == {"dtype", "shape", "data_offsets"}, f"{name}: {entry}"
    begin, stop = entry["data_offsets"]
    arr = from_bytes(dtype, body[begin:stop], shape)
    expected = value(dtype, int(np.prod(shape, dtype=np.int64))).reshape(shape)
    assert arr.shape == tuple(shape) and np.array_equal(arr, expected), f"{name}: {arr}"
    arrays[name] = arr
try:
    from safetensors import safe_open
except ImportError:
    safe_open = None
if safe_open is not None:
    with safe_open(path, framework="np") as f:
        assert (f.metadata() or {}) == metadata
        for name, dtype, shape in specs:
            if dtype != "BF16":
                assert np.array_equal(f.get_tensor(name), arrays[name]), name
    print("also read with the safetensors package")
print(f"OK {len(arrays)} tensors")
)PY";

// Writes a file the way the reference does: compact JSON, padded with spaces to a multiple of 8,
// with the data laid out in the reverse of the key order (readers must go by the offsets).
constexpr const char* kPythonWriter = R"PY(
header = {"__metadata__": metadata} if metadata else {}
chunks, offset = [], 0
for name, dtype, shape in reversed(specs):
    raw = to_bytes(dtype, value(dtype, int(np.prod(shape, dtype=np.int64))))
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
    chunks.append(raw)
    offset += len(raw)
header = {k: header[k] for k in (["__metadata__"] if metadata else []) + [s[0] for s in specs]}
text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
text += b" " * ((8 - len(text) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
print("OK written")
)PY";

// Single quotes for a POSIX shell.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Result {
  int status;
  std::string output;
};

Result run(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    output.append(buffer.data(), n);
  return {::pclose(pipe), output};
}

class SafetensorsPythonTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing; these tests need Python 3";
    const Result numpy = run(std::string(kPython) + " -c 'import numpy'");
    ASSERT_EQ(numpy.status, 0) << "numpy is not importable by " << kPython
                               << "; install python3-numpy (scripts/setup.sh does):\n"
                               << numpy.output;
  }

  // Runs `script` (after the common part) with the file, the specs and the metadata as arguments.
  Result python(const char* script, const fs::path& path, const std::vector<Spec>& specs,
                const std::map<std::string, std::string>& metadata) {
    const fs::path file = dir_ / "script.py";
    write_file_atomic(file, std::string(kPythonCommon) + script);
    const std::string metadata_json = nlohmann::json(metadata).dump();
    return run(std::string(kPython) + " " + shell_quote(file.string()) + " " +
               shell_quote(path.string()) + " " + shell_quote(specs_json(specs)) + " " +
               shell_quote(metadata_json));
  }
};

TEST_F(SafetensorsPythonTest, PythonReadsWhatAgoraWrites) {
  const std::vector<Spec> specs = sample_specs();
  const fs::path path = dir_ / "agora.safetensors";
  write_specs(path, specs, kMetadata);
  const Result result = python(kPythonReader, path, specs, kMetadata);
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("OK 12 tensors"), std::string::npos) << result.output;
}

TEST_F(SafetensorsPythonTest, PythonReadsAgoraFileWithoutMetadata) {
  const std::vector<Spec> specs = {{"lm_head.weight", DType::kBF16, {4, 3}}};
  const fs::path path = dir_ / "agora.safetensors";
  write_specs(path, specs, {});
  const Result result = python(kPythonReader, path, specs, {});
  EXPECT_EQ(result.status, 0) << result.output;
}

TEST_F(SafetensorsPythonTest, AgoraReadsWhatPythonWrites) {
  const std::vector<Spec> specs = sample_specs();
  const std::map<std::string, std::string> metadata = {{"source", "python"}, {"note", "ü ✓"}};
  const fs::path path = dir_ / "python.safetensors";
  const Result result = python(kPythonWriter, path, specs, metadata);
  ASSERT_EQ(result.status, 0) << result.output;

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), metadata);
  EXPECT_EQ(file.data_offset() % 8, 0u);
  ASSERT_EQ(file.tensors().size(), specs.size());
  for (const Spec& spec : specs) {
    const TensorInfo& t = file.at(spec.name);
    EXPECT_EQ(t.dtype, spec.dtype) << spec.name;
    EXPECT_EQ(t.shape, spec.shape) << spec.name;
    expect_values(spec, file.bytes(t));
  }
  // Python laid the data out in reverse, so offset order is the reverse of the specs, except the
  // zero-size tensor, which sits at offset 0 and sorts before the one it shares that offset with.
  EXPECT_EQ(file.tensors().front().name, "empty");
  EXPECT_EQ(file.tensors().back().name, specs.front().name);
}

}  // namespace
}  // namespace safetensors_test
}  // namespace agora
