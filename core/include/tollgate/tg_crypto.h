/*
 * Secrets at rest: upstream credentials are sealed with AES-256-GCM under a key derived
 * from TOLLGATE_SECRET_KEY (64 hex digits are used as the raw key; any other string is
 * hashed with SHA-256). A sealed value is: version byte 1 || 12-byte nonce || ciphertext
 * || 16-byte tag. API keys are never stored: only their SHA-256.
 */
#ifndef TOLLGATE_TG_CRYPTO_H
#define TOLLGATE_TG_CRYPTO_H

#include "tollgate/tg_common.h"

#define TG_SEAL_OVERHEAD (1 + 12 + 16)

/** Derives the 32-byte key from the secret. Returns 0, or TG_ERROR if secret is empty. */
int tg_crypto_key(const char *secret, uint8_t key[32]);
/** Appends the sealed form of plain[n] to out. Returns 0 or TG_ERROR. */
int tg_crypto_seal(const uint8_t key[32], const char *plain, size_t n, tg_buf_t *out);
/** Appends the opened plaintext to out. TG_ERROR if the value was altered or the key is
 *  wrong. */
int tg_crypto_open(const uint8_t key[32], const uint8_t *sealed, size_t n, tg_buf_t *out);
/** SHA-256 of data as 64 lowercase hex digits + NUL. */
void tg_sha256_hex(const void *data, size_t n, char out[65]);
/** A new API key: "tg-" + 40 random base62-ish characters; returns its length. */
size_t tg_crypto_new_api_key(char out[64]);

#endif
