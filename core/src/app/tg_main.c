/*
 * tollgate's command line: serve, check, mock-upstream (and, with later issues,
 * migrate, apply, policy, ledger). Exit codes: 0 success, 1 runtime failure, 2 bad
 * usage or configuration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_billing.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_db.h"
#include "tollgate/tg_mock.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_server.h"
#include "tollgate/tg_worker.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tollgate <command> [options]\n\n"
               "commands:\n"
               "  serve -c FILE                  run the gateway\n"
               "  check -c FILE                  validate the configuration and exit\n"
               "  migrate -c FILE                apply the sql/ migrations (embedded in the binary)\n"
               "  apply -c FILE STATE.lua [--dry-run]\n"
               "                                 upsert tenants, groups, accounts, keys, prices\n"
               "  policy test POLICY --requests FILE.jsonl\n"
               "                                 run a policy over recorded requests offline, print decisions\n"
               "  ledger verify -c FILE          check the billing invariants (exit 1 naming each problem)\n"
               "  ledger reconcile -c FILE [--older-than-ms N]\n"
               "                                 settle reservations whose usage is unknown now\n"
               "  mock-upstream --listen H:P     run the fake OpenAI/Anthropic provider\n"
               "  version                        print the version\n");
}

static const char *config_arg(int argc, char **argv) {
    for (int i = 2; i < argc - 1; i++)
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config"))
            return argv[i + 1];
    return NULL;
}

static int load(int argc, char **argv, tg_config_t *cfg) {
    const char *path = config_arg(argc, argv);
    if (!path) {
        fprintf(stderr, "tollgate %s: missing -c FILE\n", argv[1]);
        return 2;
    }
    char err[512];
    if (tg_config_load(path, cfg, err, sizeof(err)) != TG_OK) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    tg_log_level = tg_log_level_parse(cfg->log_level);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("tollgate 0.1.0\n");
        return 0;
    }
    if (!strcmp(cmd, "mock-upstream"))
        return tg_mock_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "policy"))
        return tg_policy_test_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "ledger")) {
        if (argc < 3 || (strcmp(argv[2], "verify") && strcmp(argv[2], "reconcile"))) {
            fprintf(stderr, "usage: tollgate ledger verify|reconcile -c FILE\n");
            return 2;
        }
        /* Every argument is known, or the command refuses to run: a typo must not turn
         * into a check of some other database. */
        int older = 0;
        for (int i = 3; i < argc; i++) {
            if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc) {
                i++;
            } else if (!strcmp(argv[2], "reconcile") && !strcmp(argv[i], "--older-than-ms") && i + 1 < argc &&
                       argv[i + 1][0] && strspn(argv[i + 1], "0123456789") == strlen(argv[i + 1]) &&
                       strlen(argv[i + 1]) <= 9) {
                older = atoi(argv[++i]);
            } else {
                fprintf(stderr, "tollgate ledger %s: unexpected argument \"%.64s\" (usage: tollgate ledger %s)\n",
                        argv[2], argv[i],
                        strcmp(argv[2], "verify") ? "reconcile -c FILE [--older-than-ms N]" : "verify -c FILE");
                return 2;
            }
        }
        tg_config_t cfg;
        int rc = load(argc, argv, &cfg);
        if (rc)
            return rc;
        if (!cfg.pg_conninfo) {
            fprintf(stderr, "ledger: no database: set postgres in the config or TOLLGATE_PG\n");
            tg_config_free(&cfg);
            return 2;
        }
        if (!strcmp(argv[2], "verify")) {
            rc = tg_ledger_verify_main(cfg.pg_conninfo, cfg.redis_url);
        } else {
            rc = tg_ledger_reconcile_main(cfg.pg_conninfo, cfg.redis_url, older, cfg.billing.charge_unknown);
        }
        tg_config_free(&cfg);
        return rc;
    }
    if (!strcmp(cmd, "migrate") || !strcmp(cmd, "apply")) {
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
                usage(stdout);
                return 0;
            }
        tg_config_t cfg;
        int rc = load(argc, argv, &cfg);
        if (rc)
            return rc;
        rc = tg_db_main(cmd, &cfg, argc, argv);
        tg_config_free(&cfg);
        return rc;
    }
    if (!strcmp(cmd, "check") || !strcmp(cmd, "serve")) {
        tg_config_t cfg;
        int rc = load(argc, argv, &cfg);
        if (rc)
            return rc;
        char err[512];
        tg_gateway_t *gw = NULL;
        if (!strcmp(cmd, "check")) {
            /* Validate what serve would build, without listening: the config, then every
             * enabled plugin (load, schema, a dry call). */
            rc = tg_plugins_check(&cfg.plugins, stdout);
            if (rc == 0)
                printf("config ok: listen %s:%d, upstream %s\n", cfg.listen_host, cfg.listen_port, cfg.upstream.url);
            tg_config_free(&cfg);
            return rc ? 2 : 0;
        }
        if (tg_plugins_global_init(&cfg.plugins, err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "%s\n", err);
            tg_config_free(&cfg);
            return 2;
        }
        gw = tg_gateway_create(&cfg, &tg_worker_handler, err, sizeof(err));
        if (!gw) {
            fprintf(stderr, "%s\n", err);
            tg_config_free(&cfg);
            return 2;
        }
        if (!cfg.nkeys)
            tg_log_warn("no keys configured: every data-plane request will get 401");
        rc = tg_gateway_run(gw);
        tg_gateway_destroy(gw);
        tg_plugins_global_shutdown();
        tg_config_free(&cfg);
        return rc;
    }
    fprintf(stderr, "tollgate: unknown command \"%s\"\n", cmd);
    usage(stderr);
    return 2;
}
