import type { Socket } from "node:net";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Listener, StagingBuffer, send } from "../../native/index.ts";
import { hello, peer, promptly, replyCode } from "./raw-peer.ts";
import { rejection } from "./rejection.ts";
import { transportsFor } from "./transports.ts";

// What a listener spends on peers that hold no token: a connection cap a sender still gets
// through, an absolute deadline for the hello, and no time at all after a refused one.

const MiB = 1 << 20;
/** Longer than any test here, so only the behaviour under test can close a connection. */
const FOREVER = 3600;

let source: StagingBuffer;
let destination: StagingBuffer;
beforeAll(() => {
  source = StagingBuffer.create({ size: 4 * MiB, lock: false });
  destination = StagingBuffer.create({ size: 4 * MiB, lock: false });
  source.bytes().set(randomBytes(4 * MiB));
});
afterAll(() => {
  source.free();
  destination.free();
});

/** Writes one byte every 50 ms until the connection closes: a hello's 48 bytes take 2.4 s. */
function trickle(socket: Socket): void {
  const timer = setInterval(() => socket.write(Buffer.of(0)), 50);
  socket.once("close", () => clearInterval(timer));
}

describe.each(transportsFor("test/native/listener-limits.test.ts"))("a listener whose connections strangers hold (%s)", (transport) => {
  it("lets a sender through: the oldest connection still owing its hello gives way", async () => {
    const listener = Listener.open({ maxConnections: 8, helloTimeout: FOREVER });
    const strangers = await Promise.all(Array.from({ length: 8 }, () => peer(listener)));
    try {
      // Slow-loris: every hello stops one byte short, so none is ever refused or served.
      const partial = hello(randomBytes(16).toString("hex"), { length: MiB }).subarray(0, 47);
      for (const stranger of strangers) stranger.socket.write(partial);
      const grant = listener.grant(destination, { length: 4 * MiB });
      await send({ ticket: grant.ticket, buffer: source, transport, streams: 2, chunkSize: MiB });
      await grant.completion;
      expect(destination.crc32c()).toBe(source.crc32c());
      // Connected first, so accepted first: the sender's connections displaced these.
      await promptly(strangers[0]!.closed, "closing the oldest stranger");
      expect(strangers[0]!.received().length).toBe(0);
    } finally {
      for (const stranger of strangers) stranger.socket.destroy();
      listener.close();
    }
  });
});

describe("a listener's bounds on peers without a grant", () => {
  it.each([
    ["a hello trickled from its first byte", Buffer.alloc(0)],
    ["an RDMA sender's queue pair trickled after its hello", hello(randomBytes(16).toString("hex"), { length: MiB, rdma: true })],
  ])("closes %s at the hello deadline, counted from accepting it", async (_, start) => {
    const listener = Listener.open({ helloTimeout: 0.5 });
    try {
      // Timed from before connecting: the listener accepts after that, so its deadline cannot
      // pass sooner, however late a loaded event loop reports the connection.
      const connecting = performance.now();
      const stranger = await peer(listener);
      stranger.socket.write(start);
      trickle(stranger.socket);
      await stranger.closed;
      expect(performance.now() - connecting).toBeGreaterThanOrEqual(450);
      // Closed unanswered, so by the deadline: without it the trickle would have completed the
      // hello (or the queue pair after it) in 2.4 s, and the listener would have refused that
      // with a reply. How soon the close is seen tells nothing more, and the emulated RDMA guest
      // of test:rdma, busy with soft-RoCE, reports it seconds late.
      expect(stranger.received().length).toBe(0);
    } finally {
      listener.close();
    }
  });

  it.each([
    ["an unknown token", "bad_token"],
    ["a spent token", "token_used"],
    ["a length the grant does not cover", "out_of_range"],
  ])("answers a hello with %s and closes at once, though the peer keeps trickling", async (_, code) => {
    const listener = Listener.open({ helloTimeout: FOREVER });
    try {
      const grant = listener.grant(destination, { length: MiB });
      let token = grant.ticket.token;
      let length = MiB;
      if (code === "bad_token") token = randomBytes(16).toString("hex");
      if (code === "token_used") {
        await send({ ticket: grant.ticket, buffer: source, transport: "tcp" });
        await grant.completion;
      }
      if (code === "out_of_range") length = MiB + 1;
      const sender = await peer(listener);
      sender.socket.write(hello(token, { length }));
      trickle(sender.socket);
      expect(await replyCode(sender)).toBe(code);
      await promptly(sender.closed, "closing after the refusal");
    } finally {
      listener.close();
    }
  });

  it("closes a connection beyond the cap at once when every connection serves a grant", async () => {
    const listener = Listener.open({ maxConnections: 2, helloTimeout: FOREVER });
    const grant = listener.grant(destination, { length: MiB });
    const streams = await Promise.all([0, 1].map(() => peer(listener)));
    try {
      for (const [streamIndex, stream] of streams.entries()) {
        stream.socket.write(hello(grant.ticket.token, { length: MiB, streamIndex, streamCount: 2 }));
        expect(await replyCode(stream)).toBe("");
      }
      const extra = await peer(listener);
      await promptly(extra.closed, "closing the connection beyond the cap");
      expect(extra.received().length).toBe(0);
      expect(streams.every((stream) => !stream.socket.closed)).toBe(true);
    } finally {
      listener.revoke(grant.ticket.token);
      for (const stream of streams) stream.socket.destroy();
      listener.close();
    }
    expect((await rejection(grant.completion)).code).toBe("revoked");
  });

  it("checks the cap and the hello deadline, naming the option", () => {
    expect(() => Listener.open({ maxConnections: 0 })).toThrow(/^maxConnections must be between 1 and 65536, received 0$/);
    expect(() => Listener.open({ maxConnections: 65537 })).toThrow(RangeError);
    expect(() => Listener.open({ maxConnections: 1.5 })).toThrow(/^maxConnections must be an integer, received 1.5$/);
    for (const helloTimeout of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, 3601, "10" as unknown as number]) {
      expect(() => Listener.open({ helloTimeout })).toThrow(/^helloTimeout must be a number of seconds > 0 and ≤ 3600, received /);
    }
  });
});
