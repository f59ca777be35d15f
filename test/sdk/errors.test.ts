import { connect } from "node:net";
import { once } from "node:events";
import { spawnSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { readEvents } from "../../cli/demo/events.ts";
import { ChannelServer } from "../../sdk/client/launch/channel-server.ts";
import { formatZodError, InvalidInputError, readFileAtMost } from "../../sdk/contract/errors.ts";
import { replacementFromEnv, ReplacementEnvironmentError } from "../../sdk/client/migrate.ts";
import { safeDecodeRequest } from "../../sdk/contract/protocol/codec.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { runIsolated } from "../helpers/isolated.ts";
import { tempDir } from "../service/harness.ts";

const silent = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const Doc = z.strictObject({ hosts: z.array(z.int().min(0, { error: "host indices start at 0" })), name: z.string() });
const zodError = (value: unknown) => Doc.safeParse(value).error!;

describe("zod issues as text, one shape", () => {
  it("names the source, the path of the first issue and how many more there are", () => {
    expect(formatZodError("config c.json", zodError({ hosts: [0, -1], name: "x" }))).toMatchInlineSnapshot(
      `"config c.json at hosts[1]: host indices start at 0"`,
    );
    expect(formatZodError("config c.json", zodError({ hosts: [-1, -2], name: "x" }))).toMatchInlineSnapshot(
      `"config c.json at hosts[0]: host indices start at 0 (and 1 more)"`,
    );
    expect(formatZodError("config c.json", zodError({ hosts: [], name: "x", colour: 1 }))).toMatchInlineSnapshot(
      `"config c.json: unknown field "colour"; remove it or check its spelling"`,
    );
    const error = zodError({ hosts: [-1], name: "x" });
    expect(InvalidInputError.fromZod("config c.json", error).message).toBe(formatZodError("config c.json", error));
  });

  it("is what a protocol error says", () => {
    const decoded = safeDecodeRequest(JSON.stringify({ v: PROTOCOL_VERSION, type: "job.finish", id: 1, job: "" }));
    expect(decoded.success ? null : decoded.error).toMatchObject({ code: "malformed", message: "job.finish at job: a job id must not be empty" });
  });

  it("is what a replacement's bad environment says", () => {
    const env = { MONKEYTREE_TOKEN: "t", MONKEYTREE_CONTROLLER: "tcp://c:1", MONKEYTREE_HOST: "three" };
    const error = (() => {
      try {
        return replacementFromEnv(env);
      } catch (e) {
        return e;
      }
    })();
    expect(error).toBeInstanceOf(ReplacementEnvironmentError);
    expect((error as Error).message).toMatchInlineSnapshot(
      `"replacement environment at MONKEYTREE_HOST: MONKEYTREE_HOST must be a whole number (and 11 more); a replacement gets these from the daemon that starts it"`,
    );
  });

  it("is what a worker event log's bad line says", () => {
    const good = JSON.stringify({ job: "a", group: 0, host: 1, pid: 9, event: "finished", step: 3, digest: "d" });
    const bad = JSON.stringify({ job: "a", group: 0, host: -1, pid: 9, event: "finished", step: 3, digest: "d" });
    expect(() => readEvents(`${good}\n${bad}\n`, "a.jsonl")).toThrow(/^a\.jsonl:2 at host: /);
  });

  it("is what the local channel answers a malformed request with", async () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const server = await ChannelServer.open(
      join(dir, "channel"),
      () => Promise.reject(new Error("not reached")),
      () => {},
      silent,
    );
    cleanups.push(() => server.close());
    const socket = connect(server.path);
    cleanups.push(() => socket.destroy());
    const lines = createInterface({ input: socket });
    socket.write(`${JSON.stringify({ v: 1, type: "barrier", localRank: 0, step: -1 })}\n`);
    const [line] = (await once(lines, "line")) as [string];
    expect(JSON.parse(line)).toMatchInlineSnapshot(`
      {
        "message": "channel request at step: step must not be negative",
        "type": "error",
        "v": 1,
      }
    `);
  });
});

describe("input files, read with a bound", () => {
  it("reads a file up to its bound and refuses one past it, even one without an end", () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, "doc.json");
    writeFileSync(file, "x".repeat(10));
    expect(readFileAtMost(file, 10)).toEqual({ text: "x".repeat(10) });
    expect(readFileAtMost(file, 9)).toEqual({ unread: "too-large" });
    expect(readFileAtMost("/dev/zero", 3 * 2 ** 20)).toEqual({ unread: "too-large" });
    expect(() => readFileAtMost(join(dir, "absent"), 10)).toThrow(expect.objectContaining({ code: "ENOENT" }));
  });

  it("refuses a credential or keyring that is not a regular file without reading or waiting on it", () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    // A FIFO as a credential, and as the keyring of a --keys directory.
    const fifo = join(dir, "controller.json");
    expect(spawnSync("mkfifo", [fifo]).status).toBe(0);
    // Nobody writes it, so a plain open would block forever: in a child, that fails the test.
    const result = runIsolated(
      { readCredential: "sdk/contract/protocol/auth.ts", loadKeyring: "controller/service/keys.ts" },
      [
        `for (const read of [() => readCredential("/dev/zero"), () => readCredential(${JSON.stringify(fifo)}), () => loadKeyring(${JSON.stringify(dir)})]) {`,
        `  try { read(); } catch (e) { console.log(e.name + ": " + e.message); }`,
        `}`,
      ].join("\n"),
    );
    expect(result.signal, result.stderr).toBeNull();
    expect(result.stdout.trim().split("\n")).toEqual([
      "InvalidInputError: credential /dev/zero: it is not a regular file; `monkeytree keys` writes credential files",
      `InvalidInputError: credential ${fifo}: it is not a regular file; \`monkeytree keys\` writes credential files`,
      `InvalidInputError: keyring ${fifo}: it is not a regular file; create it with \`monkeytree keys --dir ${dir}\``,
    ]);
  });
});
