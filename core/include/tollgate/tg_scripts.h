/*
 * The gateway's Redis scripts: Lua files in core/redis/, embedded in the binary at build
 * time (core/embed.cmake) like the plugin runtime's core/lua/. A script includes a
 * fragment with a line "--@<name>", which is replaced by core/redis/<name>.lua: the
 * money reservation is written once (money.lua) and taken by the admission (admit.lua)
 * and by the separate reservation (reserve.lua). A variant of a script, "<name>+<variant>",
 * also takes each line "--+<variant> <fragment>" as that fragment (the plain script reads
 * such a line as a comment): "admit+slot" is the admission with the account's slot
 * (admit_slot.lua).
 */
#ifndef TOLLGATE_TG_SCRIPTS_H
#define TOLLGATE_TG_SCRIPTS_H

/** The source of script `name` (core/redis/<name>.lua, fragments included; "<name>+<variant>"
 *  a variant of it), as sent to
 *  Redis. Made once per process and kept for its life (thread-safe); never NULL: an
 *  unknown name or fragment is a build mistake and aborts. */
const char *tg_scripts_source(const char *name);

#endif
