import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DaemonHosts, DEFAULT_COMMAND_TIMEOUT_MS, MAX_PREPARE_WAIT_MS, SLOWEST_STAGING_BYTES_PER_MS } from "../../controller/service/daemon-hosts.ts";

/**
 * How long the controller waits for a daemon's answer: a prepare, which zero-fills the grant's
 * staging file before it answers, is given time for its bytes on top of the command timeout.
 */

const GiB = 2 ** 30;
const replacement = { job: "a", group: 0, parallelism: { tp: 1, pp: 1, dp: 2 }, place: { nodeRank: 0, nodes: 2 }, replacement: "train", user: null };

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

/** Daemons for hosts 0 and 1 that never answer; the outcome of each command as it settles. */
function silentDaemons() {
  const daemons = new DaemonHosts();
  const sent: string[] = [];
  daemons.attach((_peer, frame) => void sent.push(frame));
  for (const host of [0, 1]) daemons.register(host, new Uint8Array([host]), `tcp://127.0.0.1:${7000 + host}`);
  const outcome = (promise: Promise<unknown>) => {
    const settled: { error?: Error } = {};
    promise.catch((error: unknown) => (settled.error = error as Error));
    return settled;
  };
  return { daemons, sent, outcome };
}

describe("commands to a daemon that does not answer", () => {
  it("fail a release after the command timeout, and a prepare only once its bytes had time too", async () => {
    const { daemons, sent, outcome } = silentDaemons();
    const release = outcome(daemons.release(0, "t0"));
    const prepare = outcome(daemons.prepare({ host: 1, migration: "p0/0", bytes: GiB, replacement }));
    expect(sent).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(DEFAULT_COMMAND_TIMEOUT_MS);
    expect(release.error?.message).toBe(`the daemon on host 0 did not answer daemon.release #1 within ${DEFAULT_COMMAND_TIMEOUT_MS} ms`);
    expect(prepare.error).toBeUndefined();
    const forBytes = GiB / SLOWEST_STAGING_BYTES_PER_MS;
    expect(forBytes).toBe(16_000);
    await vi.advanceTimersByTimeAsync(forBytes - 1);
    expect(prepare.error).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(prepare.error?.message).toBe(`the daemon on host 1 did not answer daemon.prepare #2 within ${DEFAULT_COMMAND_TIMEOUT_MS + forBytes} ms`);
  });

  it("waits no longer than the bound for a prepare, however many bytes a job declared", async () => {
    const { daemons, outcome } = silentDaemons();
    const prepare = outcome(daemons.prepare({ host: 1, migration: "p0/0", bytes: Number.MAX_SAFE_INTEGER, replacement }));
    await vi.advanceTimersByTimeAsync(MAX_PREPARE_WAIT_MS - 1);
    expect(prepare.error).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(prepare.error?.message).toBe(`the daemon on host 1 did not answer daemon.prepare #1 within ${MAX_PREPARE_WAIT_MS} ms`);
  });
});
