-- model-map: which model names clients may send and what each becomes upstream.
return {
    fields = {
        aliases = {
            type = "map", default = {},
            keys = { type = "string", between = { 1, 127 } },
            values = { type = "string", between = { 1, 127 } },
            description = "client model (or pattern with *) -> upstream model ('*' in the " ..
                "target is replaced by what the first '*' matched)",
        },
        reject_unknown = {
            type = "boolean", default = false,
            description = "answer 404 model_not_found for a model no alias matches",
        },
    },
}
