# Every third-party library comes from Debian's packages (scripts/setup.sh installs them).
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
# Corpora as they come (agora tokenize): gzip through zlib, Zstandard through libzstd, JSON Lines
# through simdjson.
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(SIMDJSON REQUIRED IMPORTED_TARGET simdjson)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(tomlplusplus REQUIRED)
# Logs: spdlog (Debian's is built against the system fmt).
find_package(spdlog REQUIRED)

# HTTP (the coordinator's page and JSON API, every process's /metrics): cpp-httplib. Debian
# ships it compiled (the header declares, libcpp-httplib.so defines), built with OpenSSL, zlib
# and brotli: its pkg-config flags carry the matching macros, which the class layouts depend on.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

# libsentencepiece.pc names only the processor; training lives in a second library.
find_library(SENTENCEPIECE_TRAIN_LIB sentencepiece_train REQUIRED)

if(AGORA_WITH_TORCH)
  find_package(Torch REQUIRED)
endif()
if(AGORA_BUILD_TESTS OR AGORA_FUZZ)
  find_package(GTest REQUIRED)
endif()

# The network: ZeroMQ (with CURVE, through cppzmq's header), protobuf for the wire schema,
# SQLite for the coordinator's state.
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
pkg_check_modules(PROTOBUF REQUIRED IMPORTED_TARGET protobuf)
pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
find_program(PROTOC_EXECUTABLE protoc REQUIRED)
