import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { capabilities, Listener, StagingBuffer, send, TransferError } from "../../native/index.ts";
import { canRun, rdmaDevice } from "../helpers/prerequisites.ts";
import { rejection } from "./rejection.ts";

// binding.gyp probes for <infiniband/verbs.h> + libibverbs when it configures; the generated
// makefile records the answer as a define, and only an RDMA build links the queue-pair verbs.
const buildDir = new URL("../../native/build/", import.meta.url);
const builtWithVerbs = readFileSync(new URL("monkeytree_native.target.mk", buildDir), "utf8").includes("-DMONKEYTREE_HAVE_IBVERBS");
const linksVerbs = readFileSync(new URL("Release/monkeytree_native.node", buildDir)).includes("ibv_create_qp");
const { available } = capabilities().rdma;
const onDevice = canRun("test/native/rdma.test.ts on a device", rdmaDevice());
const MiB = 1 << 20;

/** A source filled with a pattern, an empty destination, and a listener opened with `rdma`. */
function setup(rdma?: boolean) {
  const source = StagingBuffer.create({ size: 4 * MiB, lock: false });
  const destination = StagingBuffer.create({ size: 4 * MiB, lock: false });
  source.bytes().forEach((_, i, bytes) => (bytes[i] = (i * 7 + 3) & 0xff));
  const listener = Listener.open(rdma === undefined ? {} : { rdma });
  return {
    source,
    destination,
    listener,
    [Symbol.dispose]() {
      listener.close();
      source.free();
      destination.free();
    },
  };
}

describe("RDMA transport", () => {
  it("reports compiled exactly when the build found the verbs headers", () => {
    expect(capabilities().rdma.compiled).toBe(builtWithVerbs);
    expect(linksVerbs).toBe(builtWithVerbs);
  });

  it("is available only when compiled and a device is present, and says why not otherwise", () => {
    const { rdma } = capabilities();
    expect(rdma.available).toBe(rdma.compiled && rdma.present);
    if (!rdma.available) expect(rdma.reason).toMatch(/\S/);
    // Without RDMA hardware libibverbs lists no devices. A build without the verbs does not link
    // libibverbs, and on a host without it installed the probe cannot even ask.
    if (!rdma.present) expect(rdma.reason).toMatch(builtWithVerbs ? /^no RDMA devices \(/ : /^no RDMA devices \(|^libibverbs\.so\.1 not loadable: /);
  });

  it("offers RDMA in tickets exactly when the host can, and says why not", () => {
    using env = setup();
    const { ticket } = env.listener.grant(env.destination, { length: MiB });
    expect(ticket.rdma === true).toBe(available);
    if (available) {
      expect(env.listener.rdmaUnavailable).toBeNull();
    } else {
      expect(env.listener.rdmaUnavailable).toMatch(builtWithVerbs ? /no RDMA device on this host/ : /no RDMA transport.*libibverbs-dev/);
      expect(() => Listener.open({ rdma: true })).toThrow(expect.objectContaining({ code: "rdma_unavailable" }));
    }
    expect(Listener.open({ rdma: false }).rdmaUnavailable).toBe("RDMA is turned off for this listener");
  });

  it("refuses RDMA without touching the grant, which TCP then fills (transport auto)", async () => {
    // A ticket that claims RDMA from a listener that does not offer it: where this host has no
    // device the sender refuses before connecting, elsewhere the listener refuses the hello.
    using env = setup(false);
    const grant = env.listener.grant(env.destination, { offset: 4096, length: MiB + 5 });
    const ticket = { ...grant.ticket, rdma: true };
    const refused = await rejection(send({ ticket, buffer: env.source, transport: "rdma" }));
    expect(refused.code).toBe("rdma_unavailable");
    expect(refused.message).toMatch(available ? /destination does not offer RDMA.*send over TCP/ : /RDMA/);
    const sent = await send({ ticket, buffer: env.source });
    expect(sent.transport).toBe("tcp");
    expect(await grant.completion).toMatchObject({ transport: "tcp", bytes: MiB + 5 });
    expect(env.destination.crc32c(4096, MiB + 5)).toBe(env.source.crc32c(0, MiB + 5));
  });

  it("refuses transport rdma for a ticket that does not offer it, and checks the device options", async () => {
    using env = setup(false);
    const grant = env.listener.grant(env.destination, { length: MiB });
    const refused = await rejection(send({ ticket: grant.ticket, buffer: env.source, transport: "rdma" }));
    expect(refused.message).toMatch(/does not offer RDMA for this ticket/);
    expect(() => send({ ticket: grant.ticket, buffer: env.source, rdma: { port: 0 } })).toThrow(/rdma.port/);
    expect(() => send({ ticket: grant.ticket, buffer: env.source, rdma: { device: "" } })).toThrow(/rdma.device/);
    expect(() => send({ ticket: grant.ticket, buffer: env.source, transport: "udp" as never })).toThrow(/transport must be/);
    expect(() => Listener.open({ rdma: { gidIndex: 256 } })).toThrow(/rdma.gidIndex/);
    env.listener.revoke(grant.ticket.token);
  });

  // Only where an RDMA device exists: `npm run test:rdma` runs this file (and the transfer
  // suites, over both transports) in a virtual machine with a soft-RoCE device.
  it.runIf(onDevice)("moves more chunks than the send window and the receive queue hold", async () => {
    using env = setup();
    const length = 4 * MiB - 12345;
    const grant = env.listener.grant(env.destination, { offset: 12345, length });
    const progress: number[] = [];
    const sent = await send({ ticket: grant.ticket, buffer: env.source, chunkSize: 4096, progressEvery: MiB, onProgress: (n) => progress.push(n) });
    expect(sent).toMatchObject({ transport: "rdma", bytes: length });
    expect(await grant.completion).toMatchObject({ transport: "rdma", bytes: length });
    expect(env.destination.crc32c(12345, length)).toBe(env.source.crc32c(0, length));
    expect(progress.length).toBeGreaterThanOrEqual(3);
    expect(progress).toEqual([...progress].sort((a, b) => a - b));
  });

  it.runIf(onDevice)("reports an unknown device by name, listing the devices there are", async () => {
    expect(() => Listener.open({ rdma: { device: "nonexistent0" } })).toThrow(/no RDMA device named "nonexistent0" \(have: /);
    using env = setup();
    const grant = env.listener.grant(env.destination, { length: MiB });
    const refused = await rejection(send({ ticket: grant.ticket, buffer: env.source, transport: "rdma", rdma: { device: "nonexistent0" } }));
    expect(refused).toBeInstanceOf(TransferError);
    expect(refused.code).toBe("rdma_unavailable");
    expect((await send({ ticket: grant.ticket, buffer: env.source, rdma: { device: "nonexistent0" } })).transport).toBe("tcp");
    await grant.completion;
  });
});
