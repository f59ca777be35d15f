import { afterEach, describe, expect, it } from "vitest";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import type { Logger } from "../../sdk/log.ts";
import { PROTOCOL_VERSION } from "../../sdk/protocol/envelope.ts";
import { FakeController } from "../helpers/fake-controller.ts";
import { TENANT } from "../helpers/tenant.ts";

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
const prepare = (migration: string, bytes: number, replacement: string | null = "fake") => ({ type: "daemon.prepare", migration, bytes, replacement: spec(replacement) });

function refused(code: string, message: string) {
  return { v: PROTOCOL_VERSION, type: "daemon.refused", id: expect.any(Number), host: HOST, code, message };
}

describe("a daemon refusing the controller's commands", () => {
  it("refuses staging that does not fit the free ranges with no_space, and stages it once a range is free", async () => {
    const rig = await registered();
    expect(await rig.command(prepare("p0/0", STAGING + 1))).toEqual(
      refused("no_space", `no free range of ${STAGING + 1} bytes in the ${STAGING}-byte staging buffer; start the daemon with a larger --staging-bytes`),
    );
    const first = await rig.command(prepare("p0/1", STAGING / 2));
    expect(first.type).toBe("daemon.prepared");
    // Half the buffer is staged, so the next half-and-a-page fits no gap.
    expect(await rig.command(prepare("p0/2", STAGING / 2 + 4096))).toMatchObject({ type: "daemon.refused", code: "no_space" });
    expect(await rig.command({ type: "daemon.release", token: first.token })).toMatchObject({ type: "daemon.done" });
    expect(await rig.command(prepare("p0/2", STAGING / 2 + 4096))).toMatchObject({ type: "daemon.prepared" });
  });

  it("refuses a job whose replacement this daemon lacks, or that names none, with unknown_replacement", async () => {
    const rig = await registered();
    expect(await rig.command(prepare("p0/0", 4096, "other"))).toEqual(
      refused("unknown_replacement", `the daemon on host ${HOST} has no replacement "other" (job a names it); start the daemon with --replacement other=COMMAND`),
    );
    expect(await rig.command(prepare("p0/0", 4096, null))).toEqual(
      refused("unknown_replacement", `job a named no replacement command; start its launchers with --replacement NAME and the daemon on host ${HOST} with --replacement NAME=COMMAND`),
    );
    expect(rig.logs.filter((line) => /: staging \d+ bytes/.test(line))).toEqual([]);
  });

  it.skipIf(process.getuid?.() !== 0)("refuses every replacement with run_as_required when it runs as root without --run-as", async () => {
    const rig = await registered({ runAs: false });
    expect(await rig.command(prepare("p0/0", 4096))).toEqual(
      refused("run_as_required", `the daemon on host ${HOST} runs as root and starts no replacement as root; start it with --run-as USER, an unprivileged user`),
    );
  });

  it("answers a second prepare for a migration with the grant it made, staging (and starting its replacement) once", async () => {
    const rig = await registered();
    const first = await rig.command(prepare("p0/0", 8192));
    expect(first).toMatchObject({ type: "daemon.prepared", host: HOST });
    const again = await rig.command(prepare("p0/0", 8192));
    expect(again).toEqual({ ...first, id: again.id });
    expect(await rig.command(prepare("p0/0", 4096))).toEqual(refused("malformed", `migration p0/0 is already staging 8192 bytes on host ${HOST}, not 4096`));
    expect(rig.logs.filter((line) => line.startsWith("migration p0/0: staging"))).toEqual(["migration p0/0: staging 8192 bytes at offset 0"]);
    // The next move gets the range after it: the repeat took none.
    await rig.command(prepare("p0/1", 4096));
    expect(rig.logs.filter((line) => line.startsWith("migration p0/1: staging"))).toEqual(["migration p0/1: staging 4096 bytes at offset 8192"]);
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
