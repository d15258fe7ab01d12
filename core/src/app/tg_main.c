/*
 * tollgate's command line: serve, check, migrate, apply, policy, ledger, usage, mock-upstream,
 * version — one table (`commands`) holds each command's synopsis and the help its
 * --help prints. Exit codes (EXIT_CODES, printed by every help): 0 success, 1 the
 * command ran and failed, 2 bad usage or configuration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_billing.h"
#include "tollgate/tg_budgets.h"
#include "tollgate/tg_capture.h"
#include "tollgate/tg_policy_store.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_db.h"
#include "tollgate/tg_mock.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_redis_tls.h"
#include "tollgate/tg_server.h"
#include "tollgate/tg_trace.h"
#include "tollgate/tg_usage_store.h"
#include "tollgate/tg_worker.h"

#ifndef TG_VERSION
#define TG_VERSION "0.1.0"
#endif
/* The git revision the build was configured from (CMakeLists.txt), "unknown" without git. */
#ifndef TG_GIT_REV
#define TG_GIT_REV "unknown"
#endif

/* The exit codes every command keeps; `tollgate --help` and each command's help list them. */
static const char EXIT_CODES[] =
    "exit codes:\n"
    "  0  success\n"
    "  1  the command ran and failed: a server or database it could not reach, a state\n"
    "     file refused, a problem `ledger verify` found, a gateway that stopped on an error\n"
    "  2  bad usage or configuration: the message names the argument or the config key\n";

/* One entry per command: its synopsis, a sentence, and the help its --help prints. */
typedef struct {
    const char *name;
    const char *synopsis;
    const char *summary;
    const char *help;
} command_t;

static const command_t commands[] = {
    {"serve", "serve -c FILE", "run the gateway (data plane, admin API, console)",
     "Runs the gateway until SIGTERM or SIGINT: /readyz answers 503 at once, the listeners close\n"
     "after limits.drain_delay_ms, in-flight requests get limits.shutdown_timeout_ms to finish,\n"
     "then exit 0. SIGHUP reloads the plugins.\n\n"
     "  -c, --config FILE   the configuration (a Lua file; every key: examples/tollgate.lua)\n\n"
     "environment: TOLLGATE_PG, TOLLGATE_REDIS, TOLLGATE_ADMIN_TOKEN, TOLLGATE_SECRET_KEY override\n"
     "the config's postgres, redis, admin_token and secret_key.\n"
     "example: tollgate serve -c examples/tollgate.lua\n"},
    {"check", "check -c FILE", "validate the configuration and every enabled plugin, then exit",
     "Loads the configuration as serve would and every enabled plugin (load, schema, a dry\n"
     "call), prints \"config ok: ...\" and exits 0, or prints what is wrong and exits 2.\n"
     "Connects to nothing.\n\n"
     "  -c, --config FILE   the configuration\n\n"
     "example: tollgate check -c examples/tollgate.lua\n"},
    {"migrate", "migrate -c FILE", "apply the sql/ migrations (embedded in the binary)",
     "Applies the Postgres migrations in order, each in its own transaction; running it again\n"
     "is a no-op. Needs postgres in the config or TOLLGATE_PG.\n\n"
     "  -c, --config FILE   the configuration\n\n"
     "example: TOLLGATE_PG='host=/run/postgresql dbname=tollgate' tollgate migrate -c tollgate.lua\n"},
    {"apply", "apply -c FILE STATE.lua [--dry-run]", "upsert tenants, groups, accounts, keys and prices",
     "Declarative and idempotent: rows are matched by name, what changes is printed (+ created,\n"
     "~ updated: fields), the same file twice changes nothing. The whole file is one transaction:\n"
     "an item refused (named with its section and field) writes nothing. Account credentials\n"
     "are sealed with the secret key (secret_key or TOLLGATE_SECRET_KEY).\n\n"
     "  -c, --config FILE   the configuration (for postgres, redis and the secret key)\n"
     "  STATE.lua           the state file (example: examples/state.lua)\n"
     "  --dry-run           print what would change, write nothing\n\n"
     "example: tollgate apply -c tollgate.lua examples/state.lua --dry-run\n"},
    {"policy", "policy test POLICY --requests FILE.jsonl", "run a policy over recorded requests offline",
     NULL /* the workbench prints its own */},
    {"ledger", "ledger verify|reconcile -c FILE", "check the billing invariants, or settle unknown usage now",
     "  ledger verify -c FILE      check the invariants (balances = opening + top-ups - usage,\n"
     "                             no request billed twice, Redis totals = Postgres, ...);\n"
     "                             exit 1 naming each problem, 0 when the books agree\n"
     "  ledger reconcile -c FILE [--older-than-ms N]\n"
     "                             settle the reservations whose usage is unknown now (as the\n"
     "                             reconciler would), N: only those older than N ms\n\n"
     "Both need postgres (config or TOLLGATE_PG) and read redis as the gateway does.\n"
     "example: tollgate ledger verify -c tollgate.lua\n"},
    {"usage", "usage partitions|drop|rebuild -c FILE", "the usage and ledger partitions, retention, rollups",
     "  usage partitions -c FILE [--exact]\n"
     "                             list the time partitions of usage (days) and the ledger\n"
     "                             (months), made ahead first: range, rows (the planner's\n"
     "                             estimate; --exact counts them), size, and what retention\n"
     "                             (billing.usage_retention_days, ledger_retention_days) says\n"
     "  usage drop -c FILE [--dry-run]\n"
     "                             drop every partition past retention, oldest first, each\n"
     "                             after its totals are carried forward (balances, ledger\n"
     "                             totals and `ledger verify` stay exact)\n"
     "  usage rebuild -c FILE [--from YYYY-MM-DD] [--to YYYY-MM-DD]\n"
     "                             recompute the hourly rollups of those UTC days [from, to)\n"
     "                             from the usage rows (default: every day still kept)\n\n"
     "All need postgres (config or TOLLGATE_PG).\n"
     "example: tollgate usage drop -c tollgate.lua --dry-run\n"},
    {"mock-upstream", "mock-upstream --listen HOST:PORT [--threads N] [--models a,b]",
     "run the fake OpenAI/Anthropic provider (tests, benchmarks, the quickstart)",
     "A fast, deterministic fake provider: /v1/chat/completions, /v1/messages, /v1/responses,\n"
     "/v1/embeddings, /v1/models. Fault knobs in the message text ([mock status=429 chunks=20\n"
     "ttft_ms=500 ...]), x-mock-* headers, or per-credential rules (POST /_mock/faults);\n"
     "GET /_mock/stats counts requests. Every knob: the top of core/src/mock/tg_mock.c.\n\n"
     "  --listen HOST:PORT  where to listen (required)\n"
     "  --threads N         event-loop threads, 1 to 64 (default 1)\n"
     "  --models a,b        more model ids for GET /v1/models\n\n"
     "example: tollgate mock-upstream --listen 127.0.0.1:9001\n"},
    {"version", "version", "print the version and the git revision it was built from (also --version)",
     "Prints \"tollgate VERSION (git REVISION)\"; REVISION is \"unknown\" when the build had no git.\n"},
    {NULL, NULL, NULL, NULL},
};

static const command_t *command_find(const char *name) {
    for (const command_t *c = commands; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f, "usage: tollgate COMMAND [options]    (tollgate COMMAND --help for one command)\n\ncommands:\n");
    for (const command_t *c = commands; c->name; c++) {
        if (strlen(c->synopsis) > 40)
            fprintf(f, "  %s\n  %-40s %s\n", c->synopsis, "", c->summary);
        else
            fprintf(f, "  %-40s %s\n", c->synopsis, c->summary);
    }
    fprintf(f, "\nThe configuration is a Lua file returning a table; examples/tollgate.lua lists every key.\n"
               "TOLLGATE_PG, TOLLGATE_REDIS, TOLLGATE_ADMIN_TOKEN and TOLLGATE_SECRET_KEY override it.\n"
               "To try everything at once: examples/quickstart.sh\n\n%s",
            EXIT_CODES);
}

static int command_help(const command_t *c) {
    if (!c->help) {
        char *args[] = {"policy", "--help", NULL};
        return tg_policy_test_main(2, args);
    }
    printf("usage: tollgate %s\n\n%s.\n\n%s\n%s", c->synopsis, c->summary, c->help, EXIT_CODES);
    return 0;
}

/* Levenshtein distance, bounded: for "did you mean" on a mistyped command. */
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32)
        return 99;
    size_t d[33][33];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

static int unknown_command(const char *cmd) {
    const command_t *best = NULL;
    size_t bd = 3;
    for (const command_t *c = commands; c->name; c++) {
        size_t dist = edit_distance(cmd, c->name);
        if (dist < bd) {
            bd = dist;
            best = c;
        }
    }
    if (best)
        fprintf(stderr, "tollgate: unknown command \"%.64s\"; did you mean \"%s\"? (tollgate --help lists them)\n", cmd,
                best->name);
    else
        fprintf(stderr, "tollgate: unknown command \"%.64s\" (tollgate --help lists the commands)\n", cmd);
    return 2;
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
        fprintf(stderr,
                "tollgate %s: missing -c FILE, the configuration file (e.g. -c examples/tollgate.lua; "
                "see tollgate %s --help)\n",
                argv[1], argv[1]);
        return 2;
    }
    char err[512];
    if (tg_config_load(path, cfg, err, sizeof(err)) != TG_OK) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    tg_log_level = tg_log_level_parse(cfg->log_level);
    /* TLS to Redis: one client context for the process, before any worker starts. */
    if (cfg->redis_url && strncmp(cfg->redis_url, "rediss", 6) == 0) {
        tg_redis_tls_opts_t o = {cfg->redis_tls.ca_file, cfg->redis_tls.cert, cfg->redis_tls.key,
                                 cfg->redis_tls.server_name, cfg->redis_tls.verify};
        if (tg_redis_tls_setup(&o, err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "config: redis_tls: %s\n", err);
            return 2;
        }
    }
    /* The budgets' clock (tg_budgets.h): TZ made a variable of its own before any
     * thread starts, and shifted for tests only when the config asks for it. */
    tg_budget_tz_init();
    const char *off = getenv("TOLLGATE_TEST_CLOCK_OFFSET");
    if (cfg->billing.test_clock && off && *off) {
        tg_budget_set_clock_offset(strtoll(off, NULL, 10));
        tg_log_warn("budgets: the clock is shifted by %s s (billing.test_clock): for tests only", off);
    }
    return 0;
}

/* load() for a command that needs Postgres: 2 with a message naming `what` without one. */
static int load_with_pg(const char *what, int argc, char **argv, tg_config_t *cfg) {
    int rc = load(argc, argv, cfg);
    if (rc)
        return rc;
    if (!cfg->pg_conninfo) {
        fprintf(stderr, "%s: no database: set postgres in the config or TOLLGATE_PG (a libpq conninfo, e.g. "
                        "\"host=/run/postgresql dbname=tollgate\")\n",
                what);
        tg_config_free(cfg);
        return 2;
    }
    return 0;
}

/* A UTC day, YYYY-MM-DD. */
static int is_day(const char *s) {
    return strlen(s) == 10 && strspn(s, "0123456789-") == 10 && s[4] == '-' && s[7] == '-';
}

/* `tollgate usage partitions|drop|rebuild -c FILE [...]`: every argument known or refused. */
static int usage_command(int argc, char **argv) {
    /* The subcommand: the first argument that is not -c FILE. */
    const char *sub = "";
    int subi = 0;
    for (int i = 2; i < argc && !subi; i++) {
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config"))
            i++;
        else
            subi = i;
    }
    if (subi)
        sub = argv[subi];
    if (strcmp(sub, "partitions") && strcmp(sub, "drop") && strcmp(sub, "rebuild")) {
        fprintf(stderr, "tollgate usage: expected partitions, drop or rebuild (see tollgate usage --help)\n");
        return 2;
    }
    tg_usage_cmd_t c = {0};
    for (int i = 2; i < argc; i++) {
        if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc)
            i++;
        else if (i == subi)
            continue;
        else if (!strcmp(sub, "partitions") && !strcmp(argv[i], "--exact"))
            c.exact = 1;
        else if (!strcmp(sub, "drop") && !strcmp(argv[i], "--dry-run"))
            c.dry_run = 1;
        else if (!strcmp(sub, "rebuild") && !strcmp(argv[i], "--from") && i + 1 < argc && is_day(argv[i + 1]))
            c.from = argv[++i];
        else if (!strcmp(sub, "rebuild") && !strcmp(argv[i], "--to") && i + 1 < argc && is_day(argv[i + 1]))
            c.to = argv[++i];
        else {
            fprintf(stderr, "tollgate usage %s: unexpected argument \"%.64s\" (see tollgate usage --help; days are "
                            "YYYY-MM-DD)\n",
                    sub, argv[i]);
            return 2;
        }
    }
    tg_config_t cfg;
    int rc = load_with_pg("usage", argc, argv, &cfg);
    if (rc)
        return rc;
    c.pg_conninfo = cfg.pg_conninfo;
    c.usage_retention_days = cfg.billing.usage_retention_days;
    c.ledger_retention_days = cfg.billing.ledger_retention_days;
    rc = !strcmp(sub, "partitions") ? tg_usage_partitions_main(&c)
         : !strcmp(sub, "drop")     ? tg_usage_drop_main(&c)
                                    : tg_usage_rebuild_main(&c);
    tg_config_free(&cfg);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        const command_t *c = argc > 2 ? command_find(argv[2]) : NULL;
        if (argc > 2 && !c)
            return unknown_command(argv[2]);
        if (c)
            return command_help(c);
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V"))
        cmd = "version";
    const command_t *known = command_find(cmd);
    if (!known)
        return unknown_command(cmd);
    /* COMMAND --help (or -h) anywhere on the line: that command's help, nothing run. A
     * value after an option that takes one is not an option (mock-upstream --listen -h). */
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return command_help(known);
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config") || !strcmp(argv[i], "--listen") ||
            !strcmp(argv[i], "--requests"))
            i++;
    }
    if (!strcmp(cmd, "version")) {
        printf("tollgate %s (git %s)\n", TG_VERSION, TG_GIT_REV);
        return 0;
    }
    if (!strcmp(cmd, "mock-upstream"))
        return tg_mock_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "policy"))
        return tg_policy_test_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "ledger")) {
        if (argc < 3 || (strcmp(argv[2], "verify") && strcmp(argv[2], "reconcile"))) {
            fprintf(stderr, "tollgate ledger: expected verify or reconcile (usage: tollgate ledger verify|reconcile -c "
                            "FILE; see tollgate ledger --help)\n");
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
        int rc = load_with_pg("ledger", argc, argv, &cfg);
        if (rc)
            return rc;
        if (!strcmp(argv[2], "verify")) {
            rc = tg_ledger_verify_main(cfg.pg_conninfo, cfg.redis_url);
        } else {
            rc = tg_ledger_reconcile_main(cfg.pg_conninfo, cfg.redis_url, older, cfg.billing.charge_unknown);
        }
        tg_config_free(&cfg);
        return rc;
    }
    if (!strcmp(cmd, "usage"))
        return usage_command(argc, argv);
    if (!strcmp(cmd, "migrate") || !strcmp(cmd, "apply")) {
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
        /* The workbench's stored policies into plugins.store first: the runtime loads them. */
        if (tg_policy_store_boot(&cfg, err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "%s\n", err);
            tg_config_free(&cfg);
            return 2;
        }
        if (tg_plugins_global_init(&cfg.plugins, err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "%s\n", err);
            tg_config_free(&cfg);
            return 2;
        }
        if (tg_capture_start(&cfg.plugins.capture, err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "%s\n", err);
            tg_plugins_global_shutdown();
            tg_config_free(&cfg);
            return 2;
        }
        if (tg_trace_start(&cfg.tracing, err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "%s\n", err);
            tg_capture_stop();
            tg_plugins_global_shutdown();
            tg_config_free(&cfg);
            return 2;
        }
        gw = tg_gateway_create(&cfg, &tg_worker_handler, err, sizeof(err));
        if (!gw) {
            fprintf(stderr, "%s\n", err);
            tg_trace_stop();
            tg_capture_stop();
            tg_config_free(&cfg);
            return 2;
        }
        if (!cfg.nkeys)
            tg_log_warn("no keys configured: every data-plane request will get 401");
        rc = tg_gateway_run(gw);
        tg_gateway_destroy(gw);
        tg_trace_stop();
        tg_capture_stop();
        tg_plugins_global_shutdown();
        tg_config_free(&cfg);
        return rc;
    }
    return unknown_command(cmd);
}
