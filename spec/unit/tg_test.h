/*
 * A tiny unit-test harness: TG_TEST(module, name) defines a test that registers itself
 * at start-up; `tg_unit MODULE` runs that module's tests (each in a forked child with a
 * timeout, so a crash fails one test, not the run) and exits non-zero if any failed.
 */
#ifndef TG_TEST_H
#define TG_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*tg_test_fn)(void);
void tg_test_register(const char *module, const char *name, tg_test_fn fn);

#define TG_TEST(module, name)                                                               \
    static void tg_test_##module##_##name(void);                                            \
    __attribute__((constructor)) static void tg_test_reg_##module##_##name(void) {          \
        tg_test_register(#module, #name, tg_test_##module##_##name);                        \
    }                                                                                       \
    static void tg_test_##module##_##name(void)

#define ASSERT(cond)                                                                        \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);    \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define ASSERT_EQ_INT(a, b)                                                                 \
    do {                                                                                    \
        long long tg__a = (long long)(a), tg__b = (long long)(b);                           \
        if (tg__a != tg__b) {                                                               \
            fprintf(stderr, "%s:%d: %s == %lld, expected %lld\n", __FILE__, __LINE__, #a,   \
                    tg__a, tg__b);                                                          \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define ASSERT_EQ_STR(a, b)                                                                 \
    do {                                                                                    \
        const char *tg__a = (a), *tg__b = (b);                                              \
        if (strcmp(tg__a, tg__b) != 0) {                                                    \
            fprintf(stderr, "%s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__,   \
                    #a, tg__a, tg__b);                                                      \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define ASSERT_MEM(p, n, lit)                                                               \
    do {                                                                                    \
        if ((n) != sizeof(lit) - 1 || memcmp((p), (lit), (n)) != 0) {                       \
            fprintf(stderr, "%s:%d: got \"%.*s\", expected \"%s\"\n", __FILE__, __LINE__,   \
                    (int)(n), (const char *)(p), lit);                                      \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#endif
