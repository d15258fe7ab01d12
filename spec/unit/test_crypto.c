/*
 * Credential sealing (AES-256-GCM) and key helpers.
 */
#include "tg_test.h"
#include "tollgate/tg_crypto.h"

TG_TEST(crypto, seal_open_round_trip) {
    uint8_t key[32];
    ASSERT_EQ_INT(tg_crypto_key("a secret", key), 0);
    tg_buf_t sealed, plain;
    tg_buf_init(&sealed);
    tg_buf_init(&plain);
    ASSERT_EQ_INT(tg_crypto_seal(key, "sk-upstream-123", 15, &sealed), 0);
    ASSERT_EQ_INT(sealed.len, 15 + TG_SEAL_OVERHEAD);
    ASSERT(!memmem(sealed.data, sealed.len, "sk-upstream", 11));
    ASSERT_EQ_INT(tg_crypto_open(key, (uint8_t *)sealed.data, sealed.len, &plain), 0);
    ASSERT_MEM(plain.data, plain.len, "sk-upstream-123");
    tg_buf_free(&sealed);
    tg_buf_free(&plain);
}

TG_TEST(crypto, tampering_and_wrong_key_refused) {
    uint8_t key[32], other[32];
    tg_crypto_key("a secret", key);
    tg_crypto_key("another secret", other);
    tg_buf_t sealed, plain;
    tg_buf_init(&sealed);
    tg_buf_init(&plain);
    tg_crypto_seal(key, "credential", 10, &sealed);
    ASSERT_EQ_INT(tg_crypto_open(other, (uint8_t *)sealed.data, sealed.len, &plain), TG_ERROR);
    sealed.data[15] ^= 1;
    ASSERT_EQ_INT(tg_crypto_open(key, (uint8_t *)sealed.data, sealed.len, &plain), TG_ERROR);
    ASSERT_EQ_INT(tg_crypto_open(key, (uint8_t *)sealed.data, 5, &plain), TG_ERROR);
    tg_buf_free(&sealed);
    tg_buf_free(&plain);
}

TG_TEST(crypto, two_seals_differ) {
    uint8_t key[32];
    tg_crypto_key("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", key);
    ASSERT_EQ_INT(key[0], 0x01);
    tg_buf_t a, b;
    tg_buf_init(&a);
    tg_buf_init(&b);
    tg_crypto_seal(key, "x", 1, &a);
    tg_crypto_seal(key, "x", 1, &b);
    ASSERT(memcmp(a.data, b.data, a.len) != 0);
    tg_buf_free(&a);
    tg_buf_free(&b);
}

TG_TEST(crypto, api_keys_and_hash) {
    char k1[64], k2[64], h[65];
    ASSERT_EQ_INT(tg_crypto_new_api_key(k1), 43);
    tg_crypto_new_api_key(k2);
    ASSERT(strncmp(k1, "tg-", 3) == 0 && strcmp(k1, k2) != 0);
    tg_sha256_hex("abc", 3, h);
    ASSERT_EQ_STR(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}
