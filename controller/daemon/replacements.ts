import { spawnSync } from "node:child_process";
import { chmodSync, chownSync } from "node:fs";
import { ReplacementNameSchema } from "../../sdk/protocol/replacement.ts";

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
 * and a user other than the daemon's own when the daemon cannot switch users.
 */
export function resolveTenant(user: string): Tenant {
  const found = spawnSync("getent", ["passwd", user], { encoding: "utf8" });
  if (found.error) throw new ReplacementConfigError(`--run-as ${user}: cannot look users up (getent: ${found.error.message})`);
  const fields = found.stdout.split("\n")[0]!.split(":");
  if (found.status !== 0 || fields.length < 7) {
    throw new ReplacementConfigError(`--run-as ${user}: no such user on this host; create one for replacements (useradd --system monkeytree) or name an existing unprivileged user such as nobody`);
  }
  const tenant = { user: fields[0]!, uid: Number(fields[2]), gid: Number(fields[3]), home: fields[5]! };
  if (tenant.uid === 0) throw new ReplacementConfigError(`--run-as ${user} is root (uid 0): replacements run tenants' code, so name an unprivileged user such as nobody`);
  const own = process.getuid?.();
  if (own !== 0 && own !== tenant.uid) {
    throw new ReplacementConfigError(`--run-as ${user} needs the daemon to run as root to switch users (it runs as uid ${own}); leave --run-as out to run replacements as the daemon's own user`);
  }
  return tenant;
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

/**
 * Lets the tenant's replacements map the staging buffer: its group becomes the tenant's, with
 * read and write for the group (the hooks map a staged range read-write). That is the whole
 * buffer, not one range: a file cannot grant less, and a copy per range would cost the move time.
 */
export function shareStaging(path: string, tenant: Tenant): void {
  chownSync(path, -1, tenant.gid);
  chmodSync(path, 0o660);
}
