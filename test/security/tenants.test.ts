import { spawnSync } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ownCgroup, ReplacementCgroups } from "../../controller/daemon/cgroup.ts";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { loadKeyring } from "../../controller/service/keys.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { readCredential } from "../../sdk/contract/protocol/auth.ts";
import { resolveTenant, type Tenant } from "../../controller/daemon/replacements.ts";
import { send, StagingBuffer } from "../../native/index.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { ticketFor } from "../../sdk/contract/protocol/endpoint.ts";
import { runCli } from "../helpers/cli.ts";
import { FakeController } from "../helpers/fake-controller.ts";
import { canRun, cgroupV2, root } from "../helpers/prerequisites.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { RecordingHosts } from "../service/doubles.ts";
import { startController, tempDir } from "../service/harness.ts";

/**
 * Two tenants' jobs on one host, each with a user of its own: a replacement runs as its job's
 * user, cannot read the other job's staged checkpoint or credential, and what it leaves
 * running, even outside its process group, is stopped when it exits.
 */

const HOST = 3;
const SECRET = Buffer.from("SECRET-WEIGHTS-OF-VICTIM");
const BYTES = 4096;

/** The tenants' users, made once on this host (system users, no home, no login). */
function tenantUser(name: string): Tenant {
  if (spawnSync("getent", ["passwd", name]).status !== 0) {
    const made = spawnSync("useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], { encoding: "utf8" });
    if (made.status !== 0) throw new Error(`useradd ${name}: ${made.stderr || made.error?.message}`);
  }
  return resolveTenant(name);
}

/**
 * The replacement both tenants' jobs name: it notes its uid, tries to read every staging file
 * and credential that is not its own, leaves a process behind in a session of its own, and
 * stays until the test lets it go.
 */
const REPLACEMENT = `
out="$OUT/$MONKEYTREE_JOB"
id -u > "$out.uid.tmp"
for f in /dev/shm/monkeytree-* "$OUT"/job-*.json; do
  case "$f" in */"$MONKEYTREE_STAGING_BUFFER"|*/job-"$MONKEYTREE_JOB".json) continue;; esac
  if cat "$f" > /dev/null 2>&1; then echo "read $f"; else echo "refused $f"; fi
done > "$out.reads.tmp"
setsid sh -c 'echo $$ > "$0.spy.tmp" && mv "$0.spy.tmp" "$0.spy"; while :; do sleep 0.2; done' "$out" < /dev/null > /dev/null 2>&1 &
mv "$out.reads.tmp" "$out.reads"; mv "$out.uid.tmp" "$out.uid"
while [ ! -e "$out.exit" ]; do sleep 0.05; done
`;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const alive = (pid: number) => existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, "utf8"));

describe.runIf(canRun("tenants on one host", root(), cgroupV2()))("two tenants on one host", () => {
  it(
    "runs each job's replacement as its job's user, with staging and credentials the other cannot read, and stops what it leaves behind",
    async () => {
      const users = { victim: tenantUser("mt-tenant-victim"), spy: tenantUser("mt-tenant-spy") };
      // Should an assertion fail first, nothing of theirs outlives the test.
      for (const user of Object.values(users)) cleanups.push(() => spawnSync("pkill", ["-KILL", "-u", user.user]));
      const out = mkdtempSync(join(tmpdir(), "monkeytree-tenants-"));
      chmodSync(out, 0o1777);
      cleanups.push(() => rmSync(out, { recursive: true, force: true }));
      // Each job's credential, its user's alone, as an operator hands them out.
      for (const [job, user] of Object.entries(users)) {
        writeFileSync(join(out, `job-${job}.json`), `{"secret": "${job}"}`, { mode: 0o600 });
        chownSync(join(out, `job-${job}.json`), user.uid, user.gid);
      }
      const logs: string[] = [];
      const note = (line: () => string) => void logs.push(line());
      const controller = await FakeController.start();
      cleanups.push(() => controller.close());
      const cgroups = ReplacementCgroups.open(ownCgroup()!);
      cleanups.push(() => cgroups.close());
      const daemon = HostDaemon.start({
        host: HOST,
        controller: controller.endpoint,
        stagingBytes: 4 * BYTES,
        listen: { host: "127.0.0.1", port: 0 },
        heartbeatMs: 60_000,
        replacements: new Map([["tenant", `OUT=${out} exec sh -c '${REPLACEMENT.replaceAll("'", `'"'"'`)}'`]]),
        cgroups,
        log: { debug: note, info: note, warn: note, error: note },
      });
      cleanups.push(() => daemon.close());
      const registration = await controller.next("daemon.register");
      await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: registration.id });
      await daemon.ready();

      let id = 500;
      const prepare = async (job: string) => {
        const command = { v: PROTOCOL_VERSION, type: "daemon.prepare", id: id++, migration: `${job}/0`, bytes: BYTES };
        const replacement = {
          job,
          group: 0,
          parallelism: { tp: 1, pp: 1, dp: 2 },
          place: { nodeRank: 1, nodes: 2 },
          replacement: "tenant",
          user: `mt-tenant-${job}`,
        };
        await controller.send({ ...command, replacement });
        return controller.next("daemon.prepared") as Promise<{ endpoint: string; token: string }>;
      };
      // The victim's checkpoint arrives and is verified; its replacement waits to load it.
      const victim = await prepare("victim");
      const weights = StagingBuffer.create({ size: BYTES, lock: false });
      cleanups.push(() => weights.free());
      weights.bytes().set(SECRET);
      await send({ ticket: ticketFor(victim.endpoint, victim.token, BYTES), buffer: weights, offset: 0 });
      const verified = await controller.next("daemon.transfer-result");
      expect(verified).toMatchObject({ outcome: "verified" });
      await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: verified.id });
      // Then the spy's move to the same host: its replacement starts at once.
      await prepare("spy");

      const result = (job: string, what: string) => readFileSync(join(out, `${job}.${what}`), "utf8").trim();
      await expect.poll(() => existsSync(join(out, "spy.uid")) && existsSync(join(out, "victim.uid")), patiently).toBe(true);
      expect({ spy: Number(result("spy", "uid")), victim: Number(result("victim", "uid")) }).toEqual({ spy: users.spy.uid, victim: users.victim.uid });
      const reads = result("spy", "reads").split("\n");
      expect(reads.filter((line) => line.startsWith("read "))).toEqual([]);
      expect(reads).toContain(`refused ${join(out, "job-victim.json")}`);
      // The victim's staged checkpoint was there to be read, its user's alone, and the spy was refused it.
      const name = logs.map((line) => /^migration victim\/0: staging \d+ bytes in (\S+),/.exec(line)?.[1]).find(Boolean);
      const staged = `/dev/shm/${name}`;
      expect(reads).toContain(`refused ${staged}`);
      expect(statSync(staged)).toMatchObject({ uid: users.victim.uid, gid: users.victim.gid, mode: 0o100600 });

      // What the spy's replacement left in a session of its own goes when the replacement exits.
      await expect.poll(() => existsSync(join(out, "spy.spy")), patiently).toBe(true);
      const leftover = Number(result("spy", "spy"));
      expect(alive(leftover)).toBe(true);
      writeFileSync(join(out, "spy.exit"), "");
      await expect.poll(() => alive(leftover), patiently).toBe(false);
      // The victim's own leftover is untouched while its replacement runs, and its staging stays.
      await expect.poll(() => existsSync(join(out, "victim.spy")), patiently).toBe(true);
      expect(alive(Number(result("victim", "spy")))).toBe(true);
      expect(existsSync(staged)).toBe(true);
      writeFileSync(join(out, "victim.exit"), "");
      await expect.poll(() => alive(Number(result("victim", "spy"))), patiently).toBe(false);
      // Its grant ended with its replacement: its file is gone.
      await expect.poll(() => existsSync(staged), patiently).toBe(false);
    },
    SAFETY_NET_MS,
  );
});

describe("a job's user, named beside its key", () => {
  it("is written to the keyring by `monkeytree keys --user`, changed on a key that exists, and refused when malformed", async () => {
    const keys = tempDir();
    cleanups.push(() => rmSync(keys, { recursive: true, force: true }));
    // No user alice on this machine: the job's credential stays here, to be handed to alice.
    expect(await runCli("keys", "--dir", keys, "--job", "a", "--job", "b", "--user", "alice", "--operator", "ops")).toMatchObject({
      code: 0,
      stdout: expect.stringContaining(`${join(keys, "job-a.json")}: give it to alice alone`),
    });
    expect(await runCli("keys", "--dir", keys, "--job", "b", "--user", "bob")).toMatchObject({
      code: 0,
      stdout: expect.stringContaining("job-b: replacements run as bob"),
    });
    const users = loadKeyring(keys).clients.map((c) => [c.name, c.user]);
    expect(users).toEqual([
      ["job-a", "alice"],
      ["job-b", "bob"],
      ["operator-ops", undefined],
    ]);
    expect(await runCli("keys", "--dir", keys, "--job", "a", "--user", "Alice Smith")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('--user "Alice Smith": a user name is 1 to 32 of a-z'),
    });
    expect(await runCli("keys", "--dir", keys, "--user", "alice")).toMatchObject({ code: 2, stderr: expect.stringContaining("--user goes with --job") });
  });

  it(
    "reaches the destination's daemon with the move's staging request",
    async () => {
      const keys = tempDir();
      cleanups.push(() => rmSync(keys, { recursive: true, force: true }));
      await runCli("keys", "--dir", keys, "--job", "a", "--user", "alice");
      await runCli("keys", "--dir", keys, "--job", "b", "--user", "bob");
      const hosts = new RecordingHosts();
      const harness = await startController({ overrides: { keyring: loadKeyring(keys), transport: hosts, launcher: hosts } });
      cleanups.push(() => harness.close());
      const start = async (job: string, on: number[]) => {
        const client = new ControllerClient({ endpoint: harness.server.endpoint, retryMs: 200, credential: readCredential(join(keys, `job-${job}.json`)) });
        cleanups.push(() => client.close());
        const workers = on.map(
          (host) => new WorkerClient(client, { job, group: 0, host }, { tp: 1, pp: 1, dp: 2 }, { checkpointBytes: BYTES, replacement: "train" }),
        );
        await Promise.all(workers.map((w) => w.register()));
        return client;
      };
      // Both jobs cross both racks' single uplinks: one of them moves.
      await start("a", [0, 4]);
      await start("b", [1, 5]);
      await hosts.until(() => hosts.prepared.length > 0, SAFETY_NET_MS);
      const { job, user } = hosts.prepared[0]!.replacement;
      expect({ job, user }).toEqual(job === "a" ? { job, user: "alice" } : { job, user: "bob" });
    },
    SAFETY_NET_MS,
  );
});
