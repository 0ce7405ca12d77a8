// test/distributed/test_hmac_sha256: SHA-256 against the FIPS 180-4 examples (and the one-million-'a' message of the
// NIST test set) and HMAC-SHA256 against every RFC 4231 test case (keys shorter than, equal to and longer than the
// block, the truncated output of case 5), the constant-time comparison and the kernel random bytes.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "llmc/distributed/hmac_sha256.h"

namespace {

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::string sha256_hex(const std::string& s) { return llmc::to_hex(llmc::sha256(s)); }
std::string hmac_hex(const std::string& key, const std::string& msg) {
  return llmc::to_hex(llmc::hmac_sha256(key, msg));
}

}  // namespace

TEST(Sha256, Fips180Examples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
                       "lmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // 55, 56 and 64 bytes: the length fits in the last block, spills into one more, fills a block exactly.
  EXPECT_EQ(sha256_hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(HmacSha256, Rfc4231) {
  // Test case 1: a 20-byte key.
  EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3: 50 bytes of 0xdd under a 20-byte 0xaa key.
  EXPECT_EQ(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 4: a 25-byte key 0x01 .. 0x19.
  EXPECT_EQ(hmac_hex(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Test case 5: the output truncated to 128 bits.
  EXPECT_EQ(hmac_hex(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
  // Test case 6: a 131-byte key (longer than the block: hashed first).
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Test case 7: a long key and a long message.
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'),
                     "This is a test using a larger than block-size key and a larger than block-size data. The key "
                     "needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, ConstantTimeEqualAndRandomBytes) {
  EXPECT_TRUE(llmc::constant_time_equal("abc", "abc"));
  EXPECT_FALSE(llmc::constant_time_equal("abc", "abd"));
  EXPECT_FALSE(llmc::constant_time_equal("abc", "abcd"));
  EXPECT_TRUE(llmc::constant_time_equal("", ""));
  std::set<std::string> seen;
  for (int i = 0; i < 16; i++) {
    const std::string r = llmc::random_bytes(16);
    EXPECT_EQ(r.size(), 16u);
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 16u);  // 128-bit values never repeat
  EXPECT_EQ(llmc::to_hex(std::string("\x00\x7f\xff", 3)), "007fff");
}
