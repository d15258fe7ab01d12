-- The policy workbench (issue #22, item 4): operator policies edited from the console,
-- stored here with their generations and reaching every gateway instance from here (each
-- writes them to its own store folder, plugins.store, and reloads; see plugins/README.md
-- "The policy workbench"). Every change is a new generation of the policy: its source,
-- its config and where it runs (`deployed`), so a rollback restores exactly what ran
-- before. Each change also writes one row of policy_audit (who, when, what, which
-- generation), whose id is the fleet's sync number: an instance that has applied audit
-- row N has every change up to N.

CREATE TABLE policies (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9_-]{1,63}$'),
    generation  integer NOT NULL,            -- the current one (policy_generations)
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- deployed: {"groups": {"<group id>": {"mode": "shadow", "sample": 1} | {"mode": "live"}},
--            "all": true|false}  ("all": in every request's live list, beside the
--            config file's enabled plugins)
CREATE TABLE policy_generations (
    name        text NOT NULL REFERENCES policies (name) ON DELETE CASCADE,
    generation  integer NOT NULL CHECK (generation >= 1),
    source      text NOT NULL CHECK (octet_length(source) <= 262144),
    config      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(config) = 'object'),
    deployed    jsonb NOT NULL DEFAULT '{"groups": {}, "all": false}',
    sha256      text NOT NULL,
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, generation)
);

CREATE TABLE policy_audit (
    id              bigserial PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL,
    action          text NOT NULL CHECK (action IN ('upload', 'shadow', 'promote', 'rollback')),
    name            text NOT NULL,
    generation      integer NOT NULL,        -- the generation the change made
    from_generation integer,                 -- the one it replaced (NULL: a new policy)
    detail          text NOT NULL
);
CREATE INDEX policy_audit_name ON policy_audit (name, id);

-- One change, atomically: a new generation of policy p_name, the groups' plugins settings
-- made to match its deployment, one audit row. p_action:
--   upload   p_source, p_config: new source (and config), deployed as before
--   shadow   p_group (p_sample): runs beside group p_group's live policy, deciding nothing
--   promote  p_group: live for that group; p_group NULL: live for every request (only
--            after it is live for some group)
--   rollback the generation before the current one, restored whole (source, config,
--            where it runs) as a new generation
-- Refusals raise SQLSTATE P0001 (the change does not apply: 409) or P0002 (no such
-- policy or group: 404) with a sentence that says why. Returns the policy's state as JSON.
CREATE FUNCTION tg_policy_change(p_name text, p_action text, p_source text, p_config jsonb, p_group bigint,
                                 p_sample float8, p_actor text) RETURNS json LANGUAGE plpgsql AS $$
DECLARE
    cur     policy_generations;
    prev    policy_generations;
    gen     integer;
    src     text;
    conf    jsonb;
    dep     jsonb;
    old_dep jsonb := '{"groups": {}, "all": false}';
    what    text;
    from_g  integer;
    aid     bigint;
    g       text;
BEGIN
    PERFORM 1 FROM policies WHERE name = p_name FOR UPDATE;
    IF FOUND THEN
        SELECT pg.* INTO cur FROM policies p JOIN policy_generations pg ON pg.name = p.name AND pg.generation = p.generation
         WHERE p.name = p_name;
        old_dep := cur.deployed;
        from_g := cur.generation;
    ELSIF p_action <> 'upload' THEN
        RAISE EXCEPTION 'no policy named %: upload it first', p_name USING ERRCODE = 'P0002';
    END IF;
    gen := coalesce(cur.generation, 0) + 1;
    src := cur.source;
    conf := coalesce(cur.config, '{}');
    dep := old_dep;
    IF p_group IS NOT NULL AND NOT EXISTS (SELECT 1 FROM groups WHERE id = p_group) THEN
        RAISE EXCEPTION 'no group with id %', p_group USING ERRCODE = 'P0002';
    END IF;
    IF p_action = 'upload' THEN
        src := p_source;
        conf := coalesce(p_config, '{}');
        IF cur.source IS NOT DISTINCT FROM src AND cur.config IS NOT DISTINCT FROM conf THEN
            RAISE EXCEPTION 'generation % of % already holds this source and config', cur.generation, p_name
                USING ERRCODE = 'P0001';
        END IF;
        what := format('source %s (%s bytes)%s', left(encode(sha256(convert_to(src, 'UTF8')), 'hex'), 12),
                       octet_length(src),
                       CASE WHEN cur.source IS NULL THEN ', new policy'
                            WHEN cur.source IS DISTINCT FROM src THEN format(', was %s', left(cur.sha256, 12))
                            ELSE ', source unchanged' END)
                || CASE WHEN cur.config IS DISTINCT FROM conf THEN format('; config %s', conf::text) ELSE '' END;
    ELSIF p_action = 'shadow' THEN
        IF p_group IS NULL THEN
            RAISE EXCEPTION 'shadow needs a group (group_id)' USING ERRCODE = 'P0001';
        END IF;
        IF (dep->>'all')::boolean THEN
            RAISE EXCEPTION '% is live for every request already: roll back first to shadow it', p_name USING ERRCODE = 'P0001';
        END IF;
        IF dep->'groups'->p_group::text = jsonb_build_object('mode', 'shadow', 'sample', coalesce(p_sample, 1)) THEN
            RAISE EXCEPTION '% is already in shadow for group %', p_name, p_group USING ERRCODE = 'P0001';
        END IF;
        dep := jsonb_set(dep, ARRAY['groups', p_group::text], jsonb_build_object('mode', 'shadow', 'sample', coalesce(p_sample, 1)));
        what := format('shadow for group %s (%s)%s', p_group, (SELECT name FROM groups WHERE id = p_group),
                       CASE WHEN coalesce(p_sample, 1) < 1 THEN format(', on %s of its requests', p_sample) ELSE '' END);
    ELSIF p_action = 'promote' THEN
        IF p_group IS NOT NULL THEN
            IF dep->'groups'->>p_group::text IS NOT NULL AND dep->'groups'->p_group::text->>'mode' = 'live' THEN
                RAISE EXCEPTION '% is already live for group %', p_name, p_group USING ERRCODE = 'P0001';
            END IF;
            dep := jsonb_set(dep, ARRAY['groups', p_group::text], '{"mode": "live"}');
            what := format('live for group %s (%s)', p_group, (SELECT name FROM groups WHERE id = p_group));
        ELSE
            IF (dep->>'all')::boolean THEN
                RAISE EXCEPTION '% is live for every request already', p_name USING ERRCODE = 'P0001';
            END IF;
            IF NOT EXISTS (SELECT 1 FROM jsonb_each(dep->'groups') e WHERE e.value->>'mode' = 'live') THEN
                RAISE EXCEPTION 'promote % live for a group first, then for every request', p_name USING ERRCODE = 'P0001';
            END IF;
            -- Live everywhere: the groups' own entries are dropped (they would run it twice).
            dep := '{"groups": {}, "all": true}';
            what := 'live for every request';
        END IF;
    ELSIF p_action = 'rollback' THEN
        SELECT * INTO prev FROM policy_generations WHERE name = p_name AND generation = cur.generation - 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION '% has no generation before %: nothing to roll back to', p_name, cur.generation
                USING ERRCODE = 'P0001';
        END IF;
        src := prev.source;
        conf := prev.config;
        dep := prev.deployed;
        what := format('back to generation %s''s source, config and deployment', prev.generation);
    ELSE
        RAISE EXCEPTION 'unknown action %', p_action USING ERRCODE = 'P0001';
    END IF;
    IF cur.name IS NULL THEN
        INSERT INTO policies (name, generation) VALUES (p_name, gen);
    ELSE
        UPDATE policies SET generation = gen, updated_at = now() WHERE name = p_name;
    END IF;
    INSERT INTO policy_generations (name, generation, source, config, deployed, sha256, created_by)
    VALUES (p_name, gen, src, conf, dep, encode(sha256(convert_to(src, 'UTF8')), 'hex'), p_actor);
    -- The groups' settings follow the deployment: every group in the old or the new one.
    FOR g IN SELECT jsonb_object_keys(old_dep->'groups') UNION SELECT jsonb_object_keys(dep->'groups') LOOP
        UPDATE groups SET updated_at = now(), plugins = (plugins - p_name) ||
            CASE WHEN dep->'groups'->g IS NULL THEN '{}'::jsonb
                 WHEN dep->'groups'->g->>'mode' = 'shadow' THEN jsonb_build_object(p_name, jsonb_build_object(
                     'mode', 'shadow', 'sample', dep->'groups'->g->'sample', 'config', conf))
                 ELSE jsonb_build_object(p_name, jsonb_build_object('config', conf)) END
         WHERE id = g::bigint;
    END LOOP;
    INSERT INTO policy_audit (actor, action, name, generation, from_generation, detail)
    VALUES (p_actor, p_action, p_name, gen, from_g, what) RETURNING id INTO aid;
    RETURN json_build_object('name', p_name, 'generation', gen, 'deployed', dep, 'config', conf,
                             'sha256', encode(sha256(convert_to(src, 'UTF8')), 'hex'), 'audit_id', aid, 'detail', what);
END $$;
