import { randomFillSync } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { capabilities, RdmaEndpoint, StagingBuffer, TransferError } from "../../native/index.ts";

// binding.gyp probes for <infiniband/verbs.h> + libibverbs when it configures; the generated
// makefile records the answer as a define, and only an RDMA build links the queue-pair verbs.
const buildDir = new URL("../../native/build/", import.meta.url);
const builtWithVerbs = readFileSync(new URL("monkeytree_native.target.mk", buildDir), "utf8").includes(
  "-DMONKEYTREE_HAVE_IBVERBS",
);
const linksVerbs = readFileSync(new URL("Release/monkeytree_native.node", buildDir)).includes("ibv_create_qp");
const { available } = capabilities().rdma;

function openError(buffer: StagingBuffer): unknown {
  try {
    RdmaEndpoint.open({ buffer }).close();
  } catch (error) {
    return error;
  }
  return undefined;
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
    if (!rdma.present) expect(rdma.reason).toMatch(/no RDMA devices/);
  });

  it.skipIf(available)("without a usable device, open() throws rdma_unavailable and leaves the buffer free", () => {
    const buffer = StagingBuffer.create({ size: 1 << 16, lock: false });
    try {
      const error = openError(buffer);
      expect(error).toBeInstanceOf(TransferError);
      expect((error as TransferError).code).toBe("rdma_unavailable");
      expect((error as TransferError).message).toMatch(
        builtWithVerbs ? /no RDMA device on this host \(ibv_get_device_list/ : /no RDMA transport.*libibverbs-dev/,
      );
      buffer.free(); // nothing kept it pinned
      expect(buffer.freed).toBe(true);
    } finally {
      if (!buffer.freed) buffer.free();
    }
  });

  it("checks its options before touching the device", () => {
    const buffer = StagingBuffer.create({ size: 4096, lock: false });
    try {
      expect(() => RdmaEndpoint.open({ buffer, offset: 4096, length: 1 })).toThrow(RangeError);
      expect(() => RdmaEndpoint.open({ buffer, port: 0 })).toThrow(RangeError);
      buffer.free();
      expect(() => RdmaEndpoint.open({ buffer, length: 4096 })).toThrow(
        expect.objectContaining({ code: "buffer_freed" }),
      );
    } finally {
      if (!buffer.freed) buffer.free();
    }
  });

  // Only where an RDMA device exists (none on the machines this was written on, so this has not
  // run yet): two endpoints in this process, connected to each other through the device.
  it.runIf(available)("writes a range into the peer's range over a loopback queue pair", async () => {
    const source = StagingBuffer.create({ size: 1 << 20 });
    const destination = StagingBuffer.create({ size: 1 << 20 });
    const writer = RdmaEndpoint.open({ buffer: source, idleTimeout: 10 });
    const reader = RdmaEndpoint.open({ buffer: destination, idleTimeout: 10 });
    try {
      randomFillSync(source.bytes());
      writer.connect(reader.local);
      reader.connect(writer.local);
      const arrived = reader.nextWrite();
      const result = await writer.write({ offset: 4096, length: 65536, remoteOffset: 8192, imm: 7 });
      expect(result.bytes).toBe(65536);
      expect(await arrived).toEqual({ imm: 7 });
      expect(destination.crc32c(8192, 65536)).toBe(source.crc32c(4096, 65536));
      expect(() => source.free()).toThrow(expect.objectContaining({ code: "buffer_busy" }));
    } finally {
      writer.close();
      reader.close();
      source.free();
      destination.free();
    }
  });
});
