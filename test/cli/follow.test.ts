import { spawn } from "node:child_process";
import { getEventListeners } from "node:events";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { CLI } from "../../cli/paths.ts";
import { sleep } from "../../cli/status.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { ControllerEventSchema } from "../../sdk/contract/protocol/events.ts";
import { runCli } from "../helpers/cli.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { closeControllersAfterEach, startController, track, type Harness } from "../service/harness.ts";

/** `monkeytree status --follow` as an operator runs it: a process streaming a live controller's events. */

let harness: Harness | undefined;
closeControllersAfterEach();
/** Workers report on a timer of their own: they stop before their client closes. */
const workers: WorkerClient[] = [];
afterEach(() => {
  for (const w of workers.splice(0)) w.close();
});

/** Starts the follower; `next()` resolves with each line it prints, `exited` with its code and stderr. */
function follow(...args: string[]) {
  const child = spawn(process.execPath, [...CLI, "status", "--follow", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const lines: string[] = [];
  const waiting: (() => void)[] = [];
  createInterface({ input: child.stdout }).on("line", (line) => {
    lines.push(line);
    waiting.splice(0).forEach((wake) => wake());
  });
  const exited = new Promise<{ code: number | null; stderr: string }>((resolve) => child.once("exit", (code) => resolve({ code, stderr })));
  /** Resolves once a printed line matches. */
  const line = async (pattern: RegExp): Promise<string> => {
    for (;;) {
      const found = lines.find((l) => pattern.test(l));
      if (found) return found;
      await Promise.race([
        new Promise<void>((resolve) => waiting.push(resolve)),
        exited.then(() => Promise.reject(new Error(`the follower exited before printing ${pattern}: ${stderr}`))),
      ]);
    }
  };
  return { child, line, lines, exited };
}

async function startJob(endpoint: string, job: string, hosts: number[]): Promise<ControllerClient> {
  const client = track(new ControllerClient({ endpoint, timeoutMs: 5_000, retryMs: 200 }));
  const started = hosts.map((host) => new WorkerClient(client, { job, group: 0, host }, { tp: 1, pp: 1, dp: hosts.length }));
  workers.push(...started);
  await Promise.all(started.map((w) => w.register(5_000)));
  return client;
}

describe("monkeytree status --follow", () => {
  it(
    "prints the latest events, then each new one as a line, and exits 0 on SIGINT",
    async () => {
      harness = await startController();
      const client = await startJob(harness.server.endpoint, "a", [0, 1]);
      const follower = follow("--connect", harness.server.endpoint);
      expect(await follower.line(/job a started/)).toMatch(/^\d\d:\d\d:\d\d\.\d{3} {2}job a started on hosts 0, 1 \(1 rings\)$/);
      await client.finish("a");
      await follower.line(/job a finished/);
      follower.child.kill("SIGINT");
      expect(await follower.exited).toEqual({ code: 0, stderr: "" });
    },
    SAFETY_NET_MS,
  );

  it(
    "with --json prints each event's JSON line, and says so when the controller goes away",
    async () => {
      harness = await startController();
      await startJob(harness.server.endpoint, "a", [0, 4]);
      await startJob(harness.server.endpoint, "b", [1, 5]);
      // Long enough that no poll of a live controller outlasts it on a loaded machine.
      const follower = follow("--connect", harness.server.endpoint, "--json", "--timeout", "5");
      await follower.line(/"event":"plan"/);
      const events = follower.lines.map((line) => ControllerEventSchema.parse(JSON.parse(line)));
      expect(events.map((e) => e.event).slice(0, 4)).toEqual(["job-started", "job-started", "fragmentation", "plan"]);
      await harness.close();
      harness = undefined;
      const { code, stderr } = await follower.exited;
      expect(code).toBe(3);
      expect(stderr).toMatch(/^monkeytree status: the controller is unreachable: no answer to events #\d+ from tcp:\/\/127\.0\.0\.1:\d+ within 5000 ms/);
    },
    SAFETY_NET_MS,
  );

  it("leaves no abort listener behind between polls, however many it makes", async () => {
    // An idle follower sleeps between polls on one signal, until SIGINT aborts it; a listener
    // left behind by each sleep made Node warn on stderr after eleven polls.
    const stopped = new AbortController();
    for (let poll = 0; poll < 20; poll++) await sleep(1, stopped.signal);
    expect(getEventListeners(stopped.signal, "abort")).toHaveLength(0);
    const cut = sleep(600_000, stopped.signal);
    const whileWaiting = getEventListeners(stopped.signal, "abort").length;
    stopped.abort();
    await cut;
    expect(whileWaiting).toBe(1);
    expect(getEventListeners(stopped.signal, "abort")).toHaveLength(0);
  });

  it("exits 3 naming the address when no controller answers at all", async () => {
    const result = await runCli("status", "--follow", "--connect", "tcp://127.0.0.1:9", "--timeout", "0.3");
    expect(result).toMatchObject({ code: 3, stdout: "" });
    expect(result.stderr).toContain("the controller is unreachable: no answer to events #1 from tcp://127.0.0.1:9 within 300 ms");
  });
});
