import { chownSync, existsSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { ReplacementConfigError, resolveTenant } from "../controller/daemon/replacements.ts";
import { join } from "node:path";
import { curveKeyPair } from "zeromq";
import { KEYRING_FILE, loadKeyring, type Keyring } from "../controller/service/keys.ts";
import type { Credential, Principal } from "../sdk/contract/protocol/auth.ts";
import { UserNameSchema } from "../sdk/contract/protocol/replacement.ts";
import { expandHostlist, HostlistError } from "../controller/planner/model/hostlist.ts";
import type { NamedTopology } from "../controller/planner/model/named-topology.ts";
import { loadConfig } from "./config.ts";
import { helpText, list, parseCommandFlags, required, str } from "./flags.ts";
import { ExitCode, UsageError, type Command } from "./io.ts";
import { outputDir } from "./output.ts";
import { hostFlag, loadTopology } from "./topology.ts";

const FLAGS = {
  dir: required("DIR", "the key directory, created when missing", "the directory that holds the keyring and the credentials"),
  daemon: list(
    "HOSTS",
    "credentials for the daemons of these hosts, as 3, 0-15 or 0,2,5, or by name as a Slurm hostlist (gpu[001-016]) " +
      "with a topology (DIR/daemon-H.json, H the host's index): a host's daemon may speak only for that host",
  ),
  topology: str("FILE", "the topology that names the hosts; default: the site configuration's"),
  job: list("J", "a credential for job J's launchers and their replacements (DIR/job-J.json): they may register, barrier and finish only job J"),
  user: str(
    "U",
    "the local user the --job jobs' replacements run as on every host (the daemons start them as U, and stage their " +
      "checkpoints for U alone); set or changed on a job credential that exists too. Without it, and without a Slurm " +
      "job whose user says, a job's replacements run as the daemons' shared --run-as user",
  ),
  operator: list("NAME", "a credential that may read `monkeytree status` (DIR/operator-NAME.json)"),
};

const help = helpText({
  command: "monkeytree keys",
  table: FLAGS,
  about: `Creates the controller's keyring and its clients' credentials in DIR. The keyring
(DIR/${KEYRING_FILE}: the controller's CURVE keypair and every client key with what it may do)
is what \`monkeytree controller --keys DIR\` loads; each credential file holds its holder's
keypair, the controller's public key and its role, and is what that holder passes to
--credentials (or names in $MONKEYTREE_CREDENTIALS). Every file is written readable by its
owner only; hand each to its holder alone.`,
  after: `Running it again adds what is missing and keeps every key that exists: a credential file
already there is kept, never overwritten. Send the controller SIGHUP (or restart it) to load
new keys. To revoke a credential, remove its entry from DIR/${KEYRING_FILE} and send SIGHUP:
the key's next message is refused, on connections already open too. Clients and the
controller refuse a keyring or credential file that its group or others may read.

exit codes: 0 done, 2 bad usage or an unreadable keyring.`,
});

/** A name that is safe in a file name: letters, digits, ".", "_" and "-". */
const SAFE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** Indices as 3, 0-15 or 0,2,5; or names, as a hostlist, through the topology. */
function hostsOf(raw: string, topology: NamedTopology | null): number[] {
  if (/[^\d,\s-]/.test(raw) && topology) {
    try {
      return expandHostlist(raw).map((name) => hostFlag(name, topology));
    } catch (error) {
      if (error instanceof HostlistError) throw new UsageError(`--daemon: ${error.message}`);
      throw error;
    }
  }
  return raw.split(",").flatMap((part) => {
    const match = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    const from = Number(match?.[1]);
    const to = match?.[2] === undefined ? from : Number(match[2]);
    if (!match || !Number.isSafeInteger(to) || to < from || to - from >= 65_536) {
      throw new UsageError(
        `--daemon takes host indices as 3, 0-15 or 0,2,5 (at most 65,536 in a range), or host names with a topology (--topology FILE), got "${raw}"`,
      );
    }
    return Array.from({ length: to - from + 1 }, (_, i) => from + i);
  });
}

function named(flag: string, value: string): string {
  if (!SAFE.test(value)) throw new UsageError(`--${flag} "${value}" names a file: use letters, digits, ".", "_" and "-" only`);
  return value;
}

/** Writes `text` to a new file only its owner reads; fails rather than replace one. */
function writeSecret(path: string, text: string): void {
  writeFileSync(path, text, { mode: 0o600, flag: "wx" });
}

/** `--user`: a user name, for the `--job`s given with it. */
function userFlag(user: string | undefined, jobs: readonly string[]): string | undefined {
  if (user === undefined) return undefined;
  if (!jobs.length) throw new UsageError("--user goes with --job: it names the user of those jobs' replacements");
  const checked = UserNameSchema.safeParse(user);
  if (!checked.success) throw new UsageError(`--user "${user}": ${checked.error.issues[0]!.message}`);
  return checked.data;
}

/**
 * Gives a job's credential to its user, so that only the job's own processes can read it: done
 * here when this runs as root on a host that has the user, else said what to do.
 */
function giveTo(path: string, user: string): string {
  if (process.getuid?.() !== 0) return `${path}: give it to ${user} alone (chown ${user} ${path}, as root)`;
  try {
    const tenant = resolveTenant(user, `--user ${user}`);
    chownSync(path, tenant.uid, tenant.gid);
    return `${path}: now ${user}'s`;
  } catch (error) {
    if (!(error instanceof ReplacementConfigError)) throw error;
    return `${path}: give it to ${user} alone on the hosts where its job starts (${error.message})`;
  }
}

export const command: Command = {
  summary: "create the controller's keyring and daemon, job and operator credentials",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const dir = flags.dir;
    const topology = flags.daemon.length ? await loadTopology({ topology: flags.topology }, await loadConfig(), true) : null;
    const wanted: { name: string; principal: Principal }[] = [
      ...flags.daemon.flatMap((raw) => hostsOf(raw, topology)).map((host) => ({ name: `daemon-${host}`, principal: { role: "daemon", host } as const })),
      ...flags.job.map((job) => ({ name: `job-${named("job", job)}`, principal: { role: "job", job } as const })),
      ...flags.operator.map((name) => ({ name: `operator-${named("operator", name)}`, principal: { role: "operator" } as const })),
    ];
    outputDir("dir", dir, 0o700);
    const keyringPath = join(dir, KEYRING_FILE);
    let keyring: Keyring;
    if (existsSync(keyringPath)) {
      keyring = loadKeyring(dir);
    } else {
      keyring = { ...curveKeyPair(), clients: [] };
      writeSecret(keyringPath, `${JSON.stringify(keyring, null, 2)}\n`);
      io.out.write(`created ${keyringPath}: the controller's keypair (public key ${keyring.publicKey})\n`);
    }
    const user = userFlag(flags.user, flags.job);
    const clients = keyring.clients.map((c) => (user !== undefined && c.principal.role === "job" && flags.job.includes(c.principal.job) ? { ...c, user } : c));
    const changed = clients.filter((c, i) => c.user !== keyring.clients[i]!.user).map((c) => c.name);
    if (changed.length) io.out.write(`${changed.join(", ")}: replacements run as ${user}\n`);
    for (const { name, principal } of wanted) {
      const path = join(dir, `${name}.json`);
      if (existsSync(path)) {
        io.out.write(`kept ${path}: it exists\n`);
        continue;
      }
      if (clients.some((c) => c.name === name)) {
        io.err.write(`monkeytree keys: ${keyringPath} lists ${name} but ${path} is gone; remove its entry from the keyring to issue a new one\n`);
        return ExitCode.usage;
      }
      const pair = curveKeyPair();
      writeSecret(path, `${JSON.stringify({ principal, ...pair, serverKey: keyring.publicKey } satisfies Credential, null, 2)}\n`);
      clients.push({ name, publicKey: pair.publicKey, principal, ...(user !== undefined && principal.role === "job" ? { user } : {}) });
      io.out.write(`created ${path}\n`);
    }
    for (const job of user === undefined ? [] : flags.job) io.out.write(`${giveTo(join(dir, `job-${job}.json`), user!)}\n`);
    if (clients.length !== keyring.clients.length || changed.length) {
      // Replaced whole, so a crash leaves the old keyring or the new one, never half of one.
      // A `.next` left by a crash is replaced too: its mode, not 0600, would survive a rewrite.
      const next = `${keyringPath}.next`;
      rmSync(next, { force: true });
      writeSecret(next, `${JSON.stringify({ ...keyring, clients }, null, 2)}\n`);
      renameSync(next, keyringPath);
      io.out.write(`${keyringPath} lists ${clients.length} client keys; send the controller (--keys ${dir}) SIGHUP to load them\n`);
    }
    return ExitCode.ok;
  },
};
