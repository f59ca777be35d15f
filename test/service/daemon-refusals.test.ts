import { existsSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import type { Logger } from "../../sdk/contract/log.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { FakeController } from "../helpers/fake-controller.ts";
import { TENANT } from "../helpers/tenant.ts";
import { patiently } from "../helpers/wait.ts";
import { chunkHeader, hello, peer, replyCode } from "../native/raw-peer.ts";
import { ticketFor } from "../../sdk/contract/protocol/endpoint.ts";

// What a daemon refuses of the controller's commands, each with its refusal code, against a
// bare ROUTER standing in for the controller.

const STAGING = 1 << 16;
const HOST = 2;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

interface Rig {
  controller: FakeController;
  daemon: HostDaemon;
  /** Every line the daemon logged. */
  logs: string[];
  /** Sends a command and returns the daemon's answer to it. */
  command(body: Record<string, unknown>): Promise<Record<string, unknown>>;
}

let nextId = 100;

/** A registered daemon whose one configured replacement (`fake`) sleeps until it is released. */
async function registered(options: { runAs?: boolean } = {}): Promise<Rig> {
  const controller = await FakeController.start();
  const logs: string[] = [];
  const record = (make: () => string) => void logs.push(make());
  const log: Logger = { debug: record, info: record, warn: record, error: record };
  const runAs = options.runAs ?? true;
  const daemon = HostDaemon.start({
    host: HOST,
    controller: controller.endpoint,
    stagingBytes: STAGING,
    listen: { host: "127.0.0.1", port: 0 },
    heartbeatMs: 60_000,
    replacements: new Map([["fake", "sleep 60"]]),
    ...(runAs && TENANT ? { runAs: TENANT } : {}),
    log,
  });
  const tokens: string[] = [];
  cleanups.push(
    () => controller.close(),
    () => daemon.close(),
    // Released, a staged move's replacement is stopped with it.
    async () => {
      for (const token of tokens) await command({ type: "daemon.release", token });
    },
  );
  const registration = await controller.next("daemon.register");
  await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: registration.id });
  await daemon.ready();
  async function command(body: Record<string, unknown>): Promise<Record<string, unknown>> {
    const id = nextId++;
    await controller.send({ v: PROTOCOL_VERSION, id, ...body });
    for (;;) {
      const answer = await controller.next();
      if (answer.id !== id || answer.type === "daemon.heartbeat") continue;
      if (answer.type === "daemon.prepared") tokens.push(answer.token as string);
      return answer;
    }
  }
  return { controller, daemon, logs, command };
}

const spec = (replacement: string | null) => ({ job: "a", group: 0, parallelism: { tp: 1, pp: 1, dp: 2 }, place: { nodeRank: 1, nodes: 2 }, replacement });
const prepare = (migration: string, bytes: number, replacement: string | null = "fake") => ({
  type: "daemon.prepare",
  migration,
  bytes,
  replacement: spec(replacement),
});

function refused(code: string, message: string) {
  return { v: PROTOCOL_VERSION, type: "daemon.refused", id: expect.any(Number), host: HOST, code, message };
}

describe("a daemon refusing the controller's commands", () => {
  it("refuses staging past its --staging-bytes with no_space, and stages it once a grant ends", async () => {
    const rig = await registered();
    expect(await rig.command(prepare("p0/0", STAGING + 1))).toEqual(
      refused(
        "no_space",
        `${STAGING + 1} bytes do not fit in host ${HOST}'s staging: ${STAGING} of its ${STAGING} bytes are free; start the daemon with a larger --staging-bytes`,
      ),
    );
    const first = await rig.command(prepare("p0/1", STAGING / 2));
    expect(first.type).toBe("daemon.prepared");
    // Half the bytes are staged, so the next half-and-a-page does not fit.
    expect(await rig.command(prepare("p0/2", STAGING / 2 + 4096))).toMatchObject({ type: "daemon.refused", code: "no_space" });
    expect(await rig.command({ type: "daemon.release", token: first.token })).toMatchObject({ type: "daemon.done" });
    expect(await rig.command(prepare("p0/2", STAGING / 2 + 4096))).toMatchObject({ type: "daemon.prepared" });
  });

  it("refuses a job whose replacement this daemon lacks, or that names none, with unknown_replacement", async () => {
    const rig = await registered();
    expect(await rig.command(prepare("p0/0", 4096, "other"))).toEqual(
      refused(
        "unknown_replacement",
        `the daemon on host ${HOST} has no replacement "other" (job a names it); start the daemon with --replacement other=COMMAND`,
      ),
    );
    expect(await rig.command(prepare("p0/0", 4096, null))).toEqual(
      refused(
        "unknown_replacement",
        `job a named no replacement command; start its launchers with --replacement NAME and the daemon on host ${HOST} with --replacement NAME=COMMAND`,
      ),
    );
    expect(rig.logs.filter((line) => /: staging \d+ bytes/.test(line))).toEqual([]);
  });

  it.skipIf(process.getuid?.() !== 0)("refuses every replacement with run_as_required when it runs as root without --run-as", async () => {
    const rig = await registered({ runAs: false });
    expect(await rig.command(prepare("p0/0", 4096))).toEqual(
      refused(
        "run_as_required",
        `job a has no user of its own and the daemon on host ${HOST} runs as root without --run-as, so it starts no replacement for it; give the job its user (\`monkeytree keys --job a --user USER\`, or its Slurm job's) or start the daemon with --run-as USER`,
      ),
    );
  });

  it("refuses a job's user that this host does not have, or root, with unknown_user, staging nothing", async () => {
    const rig = await registered();
    const as = (user: string) => ({ ...prepare("p0/0", 4096), replacement: { ...spec("fake"), user } });
    expect(await rig.command(as("mt-no-such-user"))).toEqual(
      refused(
        "unknown_user",
        `job a's user mt-no-such-user on host ${HOST}: no such user on this host; create it (useradd --system mt-no-such-user) or name an existing unprivileged user`,
      ),
    );
    expect(await rig.command(as("root"))).toMatchObject({
      type: "daemon.refused",
      code: "unknown_user",
      message: expect.stringContaining(`job a's user root on host ${HOST} is root (uid 0)`),
    });
    expect(await rig.command(as("Not A User"))).toMatchObject({
      type: "daemon.refused",
      code: "malformed",
      message: expect.stringContaining("a user name is 1 to 32 of a-z"),
    });
    expect(rig.logs.filter((line) => /: staging \d+ bytes/.test(line))).toEqual([]);
  });

  it("answers a second prepare for a migration with the grant it made, staging (and starting its replacement) once", async () => {
    const rig = await registered();
    const first = await rig.command(prepare("p0/0", 8192));
    expect(first).toMatchObject({ type: "daemon.prepared", host: HOST });
    const again = await rig.command(prepare("p0/0", 8192));
    expect(again).toEqual({ ...first, id: again.id });
    expect(await rig.command(prepare("p0/0", 4096))).toEqual(refused("malformed", `migration p0/0 is already staging 8192 bytes on host ${HOST}, not 4096`));
    expect(rig.logs.filter((line) => line.startsWith("migration p0/0: staging"))).toEqual([
      expect.stringMatching(/^migration p0\/0: staging 8192 bytes in monkeytree-\d+-[0-9a-f]+/),
    ]);
    // The repeat reserved nothing: the rest of the staging bytes still fit.
    expect(await rig.command(prepare("p0/1", STAGING - 8192))).toMatchObject({ type: "daemon.prepared" });
  });

  it("refuses a spawn for a token it staged nothing under with unknown_token", async () => {
    const rig = await registered();
    const body = { type: "daemon.spawn", migration: "p0/0", ...spec("fake"), token: "0123456789abcdef0123456789abcdef" };
    expect(await rig.command(body)).toEqual(refused("unknown_token", `no staged checkpoint on host ${HOST} carries this token`));
    // Nor is a released grant's token good for a spawn any more.
    const { token } = await rig.command(prepare("p0/1", 4096));
    await rig.command({ type: "daemon.release", token });
    expect(await rig.command({ ...body, migration: "p0/1", token })).toMatchObject({ type: "daemon.refused", code: "unknown_token" });
  });
});

describe("a daemon released while its checkpoint is arriving", () => {
  it("answers the release and every later command, and removes the staging file once the transfer stopped", async () => {
    const rig = await registered();
    const bytes = 4 * 4096;
    const prepared = await rig.command(prepare("p0/0", bytes));
    const token = prepared.token as string;
    const name = /: staging \d+ bytes in (\S+?),? /.exec(rig.logs.join("\n"))?.[1];
    expect(existsSync(`/dev/shm/${name}`)).toBe(true);
    // A sender halfway through its only chunk: the listener's thread is writing into the file.
    const sender = await peer(ticketFor(prepared.endpoint as string, token, bytes));
    sender.socket.write(hello(token, { length: bytes }));
    expect(await replyCode(sender)).toBe("");
    sender.socket.write(Buffer.concat([chunkHeader(1, 0, bytes), Buffer.alloc(bytes / 2)]));

    expect(await rig.command({ type: "daemon.release", token })).toMatchObject({ type: "daemon.done" });
    expect(await rig.command(prepare("p0/1", 4096))).toMatchObject({ type: "daemon.prepared" });
    await sender.closed;
    await expect.poll(() => existsSync(`/dev/shm/${name}`), patiently).toBe(false);
    expect(rig.logs.filter((line) => /could not|transfer failed|received/.test(line))).toEqual([]);
  });
});
