// llmc/distributed/hmac_sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), host code, for authenticating the
// startup rendezvous (llmc/distributed/rendezvous.h) with the job's secret; a constant-time comparison for MACs; random
// bytes from the kernel. Small and self-contained on purpose: no third-party crypto library. Tested against the FIPS
// 180-4 examples and the RFC 4231 vectors (test/distributed/test_hmac_sha256.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace llmc {

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 of `data`.
Sha256Digest sha256(std::string_view data);

// HMAC-SHA256 of `message` under `key` (any length: keys longer than the 64-byte block are hashed first).
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// Lowercase hex of bytes ("" for none).
std::string to_hex(std::string_view bytes);
std::string to_hex(const Sha256Digest& digest);

// a == b, in a time that depends only on the lengths (for comparing a received MAC with the expected one).
bool constant_time_equal(std::string_view a, std::string_view b);

// n bytes from the kernel's random source (getrandom, else /dev/urandom). llmc::Error when neither works: there is no
// weaker fallback.
std::string random_bytes(size_t n);

}  // namespace llmc
