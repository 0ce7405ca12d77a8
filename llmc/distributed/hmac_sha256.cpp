// llmc/distributed/hmac_sha256.cpp: SHA-256 (FIPS 180-4 section 6.2), HMAC-SHA256 (RFC 2104), hex, constant-time
// comparison and kernel random bytes (llmc/distributed/hmac_sha256.h).

#include "llmc/distributed/hmac_sha256.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include "llmc/core/common.h"
#include "llmc/core/file_io.h"

namespace llmc {

namespace {

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr size_t kBlockBytes = 64;

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// The SHA-256 state over a stream of bytes.
class Sha256 {
 public:
  void update(std::string_view data) {
    for (const char c : data) {
      block_[fill_++] = static_cast<uint8_t>(c);
      if (fill_ == kBlockBytes) {
        compress();
        fill_ = 0;
      }
    }
    bit_length_ += uint64_t(data.size()) * 8;
  }

  Sha256Digest finish() {
    const uint64_t bits = bit_length_;
    // Padding: 0x80, zeros up to 56 bytes into a block, the message length in bits, big-endian.
    block_[fill_++] = 0x80;
    if (fill_ > kBlockBytes - 8) {
      while (fill_ < kBlockBytes) block_[fill_++] = 0;
      compress();
      fill_ = 0;
    }
    while (fill_ < kBlockBytes - 8) block_[fill_++] = 0;
    for (int i = 7; i >= 0; i--) block_[fill_++] = static_cast<uint8_t>(bits >> (8 * i));
    compress();
    Sha256Digest out;
    for (int i = 0; i < 8; i++)
      for (int b = 0; b < 4; b++) out[4 * i + b] = static_cast<uint8_t>(h_[i] >> (24 - 8 * b));
    return out;
  }

 private:
  void compress() {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
      w[t] = uint32_t(block_[4 * t]) << 24 | uint32_t(block_[4 * t + 1]) << 16 | uint32_t(block_[4 * t + 2]) << 8 |
             uint32_t(block_[4 * t + 3]);
    for (int t = 16; t < 64; t++) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; t++) {
      const uint32_t sigma1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t t1 = h + sigma1 + ((e & f) ^ (~e & g)) + kRoundConstants[t] + w[t];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[kBlockBytes] = {};
  size_t fill_ = 0;
  uint64_t bit_length_ = 0;
};

std::string_view as_view(const Sha256Digest& d) {
  return std::string_view(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

Sha256Digest sha256(std::string_view data) {
  Sha256 s;
  s.update(data);
  return s.finish();
}

Sha256Digest hmac_sha256(std::string_view key, std::string_view message) {
  uint8_t block_key[kBlockBytes] = {};
  if (key.size() > kBlockBytes) {
    const Sha256Digest k = sha256(key);
    std::memcpy(block_key, k.data(), k.size());
  } else {
    std::memcpy(block_key, key.data(), key.size());
  }
  std::string ipad(kBlockBytes, '\0'), opad(kBlockBytes, '\0');
  for (size_t i = 0; i < kBlockBytes; i++) {
    ipad[i] = static_cast<char>(block_key[i] ^ 0x36);
    opad[i] = static_cast<char>(block_key[i] ^ 0x5c);
  }
  Sha256 inner;
  inner.update(ipad);
  inner.update(message);
  const Sha256Digest inner_digest = inner.finish();
  Sha256 outer;
  outer.update(opad);
  outer.update(as_view(inner_digest));
  return outer.finish();
}

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string to_hex(const Sha256Digest& digest) { return to_hex(as_view(digest)); }

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::getrandom(out.data() + done, n - done, 0);
    if (got > 0) {
      done += size_t(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    break;  // getrandom unavailable (ENOSYS) or failing: read the device instead
  }
  if (done == n) return out;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_error("cannot read random bytes: getrandom failed and /dev/urandom: %s", std::strerror(errno));
  const IoResult r = read_fully(fd, out.data() + done, n - done);
  ::close(fd);
  if (!r.ok()) throw_error("cannot read random bytes from /dev/urandom: %s", r.what());
  return out;
}

}  // namespace llmc
