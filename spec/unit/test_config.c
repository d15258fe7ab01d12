/*
 * The Lua config loader: defaults, validation messages naming the key, env overrides.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tg_test.h"
#include "tollgate/tg_config.h"

static char path[64];

static void write_cfg(const char *text) {
    snprintf(path, sizeof(path), "/tmp/tg-unit-cfg-%d.lua", (int)getpid());
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static int load(const char *text, tg_config_t *cfg, char *err) {
    write_cfg(text);
    int rc = tg_config_load(path, cfg, err, 256);
    unlink(path);
    return rc;
}

TG_TEST(config, minimal_with_defaults) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://127.0.0.1:9/v1' } }", &cfg, err), 0);
    ASSERT_EQ_STR(cfg.listen_host, "127.0.0.1");
    ASSERT_EQ_INT(cfg.listen_port, 8080);
    ASSERT_EQ_INT(cfg.http_limits.max_body_bytes, 4 * 1024 * 1024);
    ASSERT_EQ_STR(cfg.upstream.provider, "openai");
    tg_config_free(&cfg);
}

TG_TEST(config, full) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { listen = '[::1]:9000', workers = 3, keys = {'tg-abcdefgh'},"
                       " limits = { max_body_bytes = 2048, header_timeout_ms = 5 },"
                       " upstream = { url = 'https://api.example.com/v1', api_key = 'sk' } }",
                       &cfg, err),
                  0);
    ASSERT_EQ_STR(cfg.listen_host, "::1");
    ASSERT_EQ_INT(cfg.listen_port, 9000);
    ASSERT_EQ_INT(cfg.workers, 3);
    ASSERT_EQ_INT(cfg.nkeys, 1);
    ASSERT_EQ_STR(cfg.keys[0], "tg-abcdefgh");
    ASSERT_EQ_INT(cfg.http_limits.max_body_bytes, 2048);
    ASSERT_EQ_INT(cfg.http_limits.header_timeout_ms, 5);
    tg_config_free(&cfg);
}

TG_TEST(config, errors_name_the_key) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, workers = 'two' }", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "workers") && strstr(err, "number"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'ftp://x' } }", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "upstream.url"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x' }, lisen = 'x' }", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "lisen") && strstr(err, "unknown key"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x' }, limits = { max_body_bytes = -5 } }", &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "limits.max_body_bytes"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x' }, listen = 'nope' }", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "listen"));
    ASSERT_EQ_INT(load("return 42", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "must return a table"));
    ASSERT_EQ_INT(load("return {", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "config:"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x' }, tls = { listen = '127.0.0.1:1' } }", &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "tls.cert"));
}

/* plugins.store: the workbench's folder is searched after dirs; it may not be one of
 * them (the gateway removes the files there that Postgres does not hold). */
TG_TEST(config, plugins_store) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, plugins = { dirs = { 'plugins' }, store = "
                       "'var/policies' } }",
                       &cfg, err),
                  0);
    ASSERT_EQ_STR(cfg.plugins.store, "var/policies");
    ASSERT_EQ_INT(cfg.plugins.ndirs, 2);
    ASSERT_EQ_STR(cfg.plugins.dirs[1], "var/policies");
    tg_config_free(&cfg);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, plugins = { dirs = { 'plugins', 'policies' }, "
                       "store = 'policies' } }",
                       &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "plugins.store") && strstr(err, "a folder of its own"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, plugins = { store = 3 } }", &cfg, err), TG_ERROR);
    ASSERT(strstr(err, "plugins.store"));
}

/* limiter.on_redis_down_*: the tokens policy follows the rate policy unless set apart;
 * anything but closed / open / local, or a non-string, is refused naming the key. */
TG_TEST(config, limiter_policies) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, limiter = { on_redis_down_rate = 'closed' } }",
                       &cfg, err),
                  0);
    ASSERT_EQ_INT(cfg.limiter.fail_rate, 0);
    ASSERT_EQ_INT(cfg.limiter.fail_tokens, 0);
    tg_config_free(&cfg);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, limiter = { on_redis_down_rate = 'closed',"
                       " on_redis_down_tokens = 'open', on_redis_down_concurrency = 'local' } }",
                       &cfg, err),
                  0);
    ASSERT_EQ_INT(cfg.limiter.fail_rate, 0);
    ASSERT_EQ_INT(cfg.limiter.fail_tokens, 1);
    ASSERT_EQ_INT(cfg.limiter.fail_concurrency, 2);
    tg_config_free(&cfg);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, limiter = { on_redis_down_tokens = 'sometimes' } }",
                       &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "limiter.on_redis_down_tokens") && strstr(err, "sometimes"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, limiter = { on_redis_down_tokens = 3 } }", &cfg,
                       err),
                  TG_ERROR);
    ASSERT(strstr(err, "limiter.on_redis_down_tokens"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, limiter = { on_redis_down_money = 'open' } }",
                       &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "on_redis_down_money") && strstr(err, "unknown key"));
}

TG_TEST(config, env_overrides) {
    tg_config_t cfg;
    char err[256];
    setenv("TOLLGATE_REDIS", "unix:///tmp/r.sock", 1);
    setenv("TOLLGATE_ADMIN_TOKEN", "adm-from-env", 1);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x' }, redis = 'redis://a:1', admin_token = 'f' }", &cfg, err), 0);
    ASSERT_EQ_STR(cfg.redis_url, "unix:///tmp/r.sock");
    ASSERT_EQ_STR(cfg.admin_token, "adm-from-env");
    tg_config_free(&cfg);
}

TG_TEST(config, hostport) {
    char *h = NULL;
    int port = 0;
    ASSERT_EQ_INT(tg_config_parse_hostport("127.0.0.1:80", &h, &port), 0);
    ASSERT_EQ_STR(h, "127.0.0.1");
    ASSERT_EQ_INT(port, 80);
    free(h);
    ASSERT_EQ_INT(tg_config_parse_hostport("127.0.0.1:99999", &h, &port), TG_ERROR);
    ASSERT_EQ_INT(tg_config_parse_hostport("127.0.0.1", &h, &port), TG_ERROR);
    ASSERT_EQ_INT(tg_config_parse_hostport(":80", &h, &port), TG_ERROR);
}

/* max_tokens_models (issue #15): a list of model names or prefixes; anything else names the key. */
TG_TEST(fidelity, config_max_tokens_models) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, max_tokens_models = { 'legacy-*', 'gpt-3.5-turbo' } }",
                       &cfg, err),
                  0);
    ASSERT_EQ_INT(cfg.nmax_tokens_models, 2);
    ASSERT_EQ_STR(cfg.max_tokens_models[0], "legacy-*");
    tg_config_free(&cfg);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' } }", &cfg, err), 0);
    ASSERT_EQ_INT(cfg.nmax_tokens_models, 0);
    tg_config_free(&cfg);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, max_tokens_models = 'legacy' }", &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "max_tokens_models"));
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://x/v1' }, max_tokens_models = { 'a', 5 } }", &cfg, err),
                  TG_ERROR);
    ASSERT(strstr(err, "max_tokens_models") && strstr(err, "entry 2"));
}
