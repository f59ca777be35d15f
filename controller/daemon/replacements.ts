import { spawnSync } from "node:child_process";
import { ReplacementNameSchema } from "../../sdk/contract/protocol/replacement.ts";

/**
 * What a daemon may start as a replacement is decided on its own host: commands the operator
 * named (`--replacement NAME=COMMAND`), run as an unprivileged user (`--run-as USER`) with an
 * environment of the daemon's choosing. A job only names which command it needs.
 */

/** A replacement setting the operator must fix: a bad NAME=COMMAND, an unknown or privileged user. */
export class ReplacementConfigError extends Error {
  override readonly name = "ReplacementConfigError";
}

/** The user a daemon running as root starts replacements as, resolved once at start. */
export interface Tenant {
  readonly user: string;
  readonly uid: number;
  readonly gid: number;
  readonly home: string;
}

/** A `--replacement` name, checked; `given` is the flag's value, for the message. */
export function replacementName(name: string, given = name): string {
  const checked = ReplacementNameSchema.safeParse(name);
  if (!checked.success) throw new ReplacementConfigError(`--replacement "${given}": ${checked.error.issues[0]!.message}`);
  return checked.data;
}

/** The `--replacement NAME=COMMAND` flags as a table; each name once. */
export function parseReplacements(flags: readonly string[]): ReadonlyMap<string, string> {
  const table = new Map<string, string>();
  for (const raw of flags) {
    const split = raw.indexOf("=");
    const name = replacementName(split < 0 ? raw : raw.slice(0, split), raw);
    const command = split < 0 ? "" : raw.slice(split + 1).trim();
    if (command === "") throw new ReplacementConfigError(`--replacement ${name} has no command: give it as --replacement ${name}=COMMAND`);
    if (table.has(name)) throw new ReplacementConfigError(`--replacement ${name} is given twice; give each name one command`);
    table.set(name, command);
  }
  return table;
}

/**
 * Looks `user` up in the host's user database. Refuses root (replacements run tenants' code),
 * and a user other than the daemon's own when the daemon cannot switch users. `what` names
 * where the user came from, for the message: the `--run-as` flag, or a job.
 */
export function resolveTenant(user: string, what = `--run-as ${user}`): Tenant {
  const found = spawnSync("getent", ["passwd", user], { encoding: "utf8" });
  if (found.error) throw new ReplacementConfigError(`${what}: cannot look users up (getent: ${found.error.message})`);
  const fields = found.stdout.split("\n")[0]!.split(":");
  if (found.status !== 0 || fields.length < 7) {
    throw new ReplacementConfigError(`${what}: no such user on this host; create it (useradd --system ${user}) or name an existing unprivileged user`);
  }
  const tenant = { user: fields[0]!, uid: Number(fields[2]), gid: Number(fields[3]), home: fields[5]! };
  if (tenant.uid === 0) throw new ReplacementConfigError(`${what} is root (uid 0): replacements run tenants' code, so name an unprivileged user`);
  const own = process.getuid?.();
  if (own !== 0 && own !== tenant.uid) {
    throw new ReplacementConfigError(
      `${what}: switching to that user needs the daemon to run as root (it runs as uid ${own}); run the daemon as root, or as that user`,
    );
  }
  return tenant;
}

/** Refuses to start a root daemon that could not switch to a job's user: it needs util-linux's setpriv. */
export function requireSetpriv(): void {
  if (process.getuid?.() !== 0) return;
  const probe = spawnSync("setpriv", ["--version"], { encoding: "utf8" });
  if (probe.status !== 0)
    throw new ReplacementConfigError(
      `a daemon running as root starts replacements as their jobs' users with setpriv, which is not here (${probe.error?.message ?? probe.stderr.trim()}); install util-linux`,
    );
}

/**
 * The argv that starts a replacement's shell `command`: first, still as root, it enters its
 * cgroup (so nothing it starts is outside it), then drops to the tenant's user with its groups,
 * then runs the command. Each step `exec`s the next, so the launcher's pid is the one spawned.
 */
export function launchArgv(command: string, how: { readonly tenant?: Tenant; readonly cgroupProcs?: string } = {}): string[] {
  const shell = ["/bin/sh", "-c", command];
  const asTenant = how.tenant ? ["setpriv", `--reuid=${how.tenant.uid}`, `--regid=${how.tenant.gid}`, "--init-groups", "--", ...shell] : shell;
  return how.cgroupProcs ? ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', how.cgroupProcs, ...asTenant] : asTenant;
}

/** What a replacement inherits from the daemon: where programs are and the locale, nothing that could be a secret. */
const INHERITED = ["PATH", "LANG", "LC_ALL", "TZ"];
/** The daemon's own identity, passed on only when replacements run as the daemon's user. */
const IDENTITY = ["HOME", "USER", "LOGNAME"];

/** A replacement's environment before the migration's MONKEYTREE_* variables. */
export function baseEnvironment(tenant: Tenant | undefined, env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const names = tenant === undefined ? [...INHERITED, ...IDENTITY] : INHERITED;
  const kept = Object.fromEntries(names.flatMap((name) => (env[name] === undefined ? [] : [[name, env[name]]])));
  return tenant === undefined ? kept : { ...kept, HOME: tenant.home, USER: tenant.user, LOGNAME: tenant.user };
}
