import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StagingBuffer, send, transferTicketSchema } from "../../native/index.ts";
import { createHosts, type Hosts } from "../e2e/netns.ts";
import { canRun, networkNamespaces } from "../helpers/prerequisites.ts";
import { rejection } from "./rejection.ts";

/**
 * A link cut in the middle of a transfer: the receiver sits in a network namespace whose link
 * goes down once bytes are moving, and stays down. The sender's kernel would retransmit for
 * many minutes; the send must fail on its own, by its idle timeout, without the link coming back.
 */

const MiB = 1 << 20;
const LENGTH = 256 * MiB;
const runTs = new URL("../../bin/run-ts.js", import.meta.url).pathname;
const receiver = new URL("./fixtures/receiver.ts", import.meta.url).pathname;
const runs = canRun("test/native/cut-link.test.ts", networkNamespaces());

describe.skipIf(!runs)("a transfer whose link is cut", () => {
  let hosts: Hosts;

  beforeAll(() => {
    hosts = createHosts(1);
  });

  afterAll(() => hosts?.remove());

  it("fails the send with a timeout while the link is still down", async () => {
    const source = StagingBuffer.create({ size: LENGTH, lock: false });
    const destination = StagingBuffer.create({ size: LENGTH, lock: false });
    const child = spawn(hosts.exec(0)[0]!, [...hosts.exec(0).slice(1), process.execPath, runTs, receiver, destination.name, hosts.address(0)], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    try {
      const [line] = (await once(createInterface({ input: child.stdout }), "line")) as [string];
      const ticket = transferTicketSchema.parse(JSON.parse(line));
      let cut = false;
      const cutOnce = () => {
        if (cut) return;
        cut = true;
        hosts.link(0, "down");
      };
      const sent = send({ ticket, buffer: source, transport: "tcp", streams: 1, chunkSize: MiB, progressEvery: 4 * MiB, idleTimeout: 1, onProgress: cutOnce });
      const error = await rejection(sent);
      expect(cut).toBe(true);
      expect(error.code).toBe("timeout");
      expect(error.message).toMatch(/within the idle timeout/);
    } finally {
      hosts.link(0, "up");
      child.kill("SIGKILL");
      source.free();
      destination.free();
    }
  }, 60_000);
});
