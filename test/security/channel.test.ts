import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ChannelServer } from "../../sdk/client/launch/channel-server.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { CHANNEL_VERSION, MAX_CHANNEL_LINE_BYTES } from "../../sdk/contract/protocol/channel.ts";
import { MAX_GPUS_PER_HOST, MAX_ID_LENGTH } from "../../sdk/contract/protocol/limits.ts";

/**
 * The launcher's local channel holds its processes' requests to bounds, as the controller holds
 * its clients': a field out of range is answered with an error naming it and never reaches the
 * launcher, and a line too long to be a request closes the connection.
 */

const dir = mkdtempSync(join(tmpdir(), "monkeytree-channel-"));
const handled: unknown[] = [];
const logs: string[] = [];
let server: ChannelServer;
beforeAll(async () => {
  server = await ChannelServer.open(
    join(dir, "channel.sock"),
    (request) => {
      handled.push(request);
      return Promise.resolve({ v: CHANNEL_VERSION, type: "directive", directive: { kind: "continue" } });
    },
    (phase) => handled.push(phase),
    createLogger("launcher", (line) => logs.push(line)),
  );
});
afterAll(async () => {
  await server.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A process's connection: writes raw text, reads answers, and tells when the launcher closed it. */
async function process() {
  const socket = connect(server.path);
  await once(socket, "connect");
  const answers = createInterface({ input: socket })[Symbol.asyncIterator]();
  const closed = new Promise((resolve) => socket.once("close", resolve));
  return {
    socket,
    closed,
    ask: async (text: string): Promise<Record<string, unknown>> => {
      socket.write(text);
      const { value } = await answers.next();
      return JSON.parse(String(value)) as Record<string, unknown>;
    },
  };
}

const request = (fields: Record<string, unknown>) => `${JSON.stringify({ v: CHANNEL_VERSION, ...fields })}\n`;

describe("the local channel's bounds", () => {
  it.each([
    [
      { type: "barrier", localRank: MAX_GPUS_PER_HOST, step: 1 },
      `channel request at localRank: localRank must be at most ${MAX_GPUS_PER_HOST - 1}, the largest MonkeyTree supports`,
    ],
    [{ type: "barrier", localRank: 0, step: 1.5 }, "channel request at step: step must be a whole number"],
    [{ type: "attach", localRank: 0, pid: 0 }, "channel request at pid: pid must be at least 1"],
    [{ type: "saved", localRank: 0, bytes: -1 }, "channel request at bytes: bytes must not be negative"],
    [
      { type: "phase", localRank: 0, name: "x".repeat(MAX_ID_LENGTH + 1), seconds: 1 },
      `channel request at name: phase name is longer than ${MAX_ID_LENGTH} characters`,
    ],
    // JSON has no Infinity: it arrives as null.
    [{ type: "phase", localRank: 0, name: "load", seconds: Infinity }, "channel request at seconds: seconds must be a finite number"],
    [
      { type: "phase", localRank: 0, name: "load\n[launcher] forged", seconds: 1 },
      "channel request at name: phase name may hold only letters, digits and . _ : @ + = / -",
    ],
  ])("answers %j with an error naming the field, and the launcher never sees it", async (fields, message) => {
    const p = await process();
    expect(await p.ask(request(fields))).toEqual({ v: CHANNEL_VERSION, type: "error", message });
    expect(handled).toEqual([]);
    p.socket.destroy();
  });

  it("answers a line longer than a request can be, closes the connection, and still serves others", async () => {
    const p = await process();
    // No newline: before the bound the launcher would buffer this without end.
    const answer = p.ask("x".repeat(4 * MAX_CHANNEL_LINE_BYTES));
    expect(await answer).toEqual({
      v: CHANNEL_VERSION,
      type: "error",
      message: `a request line is longer than ${MAX_CHANNEL_LINE_BYTES} bytes; send one JSON request per line`,
    });
    await p.closed;
    expect(logs.some((line) => line.includes("closing the connection"))).toBe(true);

    const other = await process();
    expect(await other.ask(request({ type: "barrier", localRank: 1, step: 3 }))).toEqual({
      v: CHANNEL_VERSION,
      type: "directive",
      directive: { kind: "continue" },
    });
    expect(handled).toEqual([{ v: CHANNEL_VERSION, type: "barrier", localRank: 1, step: 3 }]);
    other.socket.destroy();
  });
});
