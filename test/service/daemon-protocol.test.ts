import { afterEach, describe, expect, it } from "vitest";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { FakeController } from "../helpers/fake-controller.ts";

/** The daemon's side of the protocol, against a bare ROUTER that answers as each test needs. */

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function daemonAgainstFake(): Promise<{ controller: FakeController; daemon: HostDaemon }> {
  const controller = await FakeController.start();
  const daemon = HostDaemon.start({
    host: 2,
    controller: controller.endpoint,
    stagingBytes: 1 << 16,
    listen: { host: "127.0.0.1", port: 0 },
    heartbeatMs: 50,
    retryMs: 100,
  });
  cleanups.push(
    () => controller.close(),
    () => daemon.close(),
  );
  return { controller, daemon };
}

describe("per-host daemon: requests and commands on one connection", () => {
  it("registers, and registers again when a heartbeat's answer says the controller no longer knows the host", async () => {
    const { controller, daemon } = await daemonAgainstFake();
    const first = await controller.next("daemon.register");
    expect(first).toMatchObject({ v: PROTOCOL_VERSION, host: 2, stagingBytes: 1 << 16, endpoint: daemon.endpoint });
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: first.id });
    await daemon.ready();
    const beat = await controller.next("daemon.heartbeat");
    await controller.send({ v: PROTOCOL_VERSION, type: "error", id: beat.id, code: "unknown_worker", message: "host 2 is not registered" });
    const again = await controller.next("daemon.register");
    expect(again).toMatchObject({ host: 2, endpoint: daemon.endpoint });
    expect(again.id).not.toBe(first.id);
  });

  it("answers the controller's commands, and refuses a malformed one naming the field", async () => {
    const { controller } = await daemonAgainstFake();
    const registration = await controller.next("daemon.register");
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: registration.id });
    await controller.send({ v: PROTOCOL_VERSION, type: "daemon.release", id: registration.id, token: "nothing-staged" });
    expect(await controller.next("daemon.done")).toEqual({ v: PROTOCOL_VERSION, type: "daemon.done", id: registration.id, host: 2 });
    const replacement = { job: "a", group: 0, parallelism: { tp: 1, pp: 1, dp: 2 }, place: { nodeRank: 1, nodes: 2 }, replacement: null };
    await controller.send({ v: PROTOCOL_VERSION, type: "daemon.prepare", id: 900, migration: "p0/0", bytes: 0, replacement });
    expect(await controller.next("daemon.refused")).toEqual({
      v: PROTOCOL_VERSION,
      type: "daemon.refused",
      id: 900,
      host: 2,
      code: "malformed",
      message: "daemon.prepare at bytes: a checkpoint to stage has at least 1 byte",
    });
  });

  it("rejects ready() with the controller's reason when it refuses the host", async () => {
    const { controller, daemon } = await daemonAgainstFake();
    const registration = await controller.next("daemon.register");
    await controller.send({
      v: PROTOCOL_VERSION,
      type: "error",
      id: registration.id,
      code: "malformed",
      message: "host 2 is outside the topology (hosts 0..1)",
    });
    await expect(daemon.ready()).rejects.toThrow("the controller refused host 2: host 2 is outside the topology (hosts 0..1)");
  });

  it("rejects ready() naming the version mismatch when the controller answers in another protocol version", async () => {
    const { controller, daemon } = await daemonAgainstFake();
    const registration = await controller.next("daemon.register");
    expect(registration).toMatchObject({ v: PROTOCOL_VERSION });
    // A controller of the previous release refuses the registration in its own version.
    await controller.send({ v: 1, type: "error", id: registration.id, code: "unsupported_version", message: "protocol version 2 is not supported" });
    await expect(daemon.ready()).rejects.toThrow(`the controller refused host 2: the controller at ${controller.endpoint} speaks another protocol version: `);
  });

  it("registers again, as the same incarnation, while the host's previous daemon is still live to the controller", async () => {
    const { controller, daemon } = await daemonAgainstFake();
    const first = await controller.next("daemon.register");
    await controller.send({ v: PROTOCOL_VERSION, type: "error", id: first.id, code: "conflict", message: "host 2 already has a live daemon" });
    // Resends of the first request may still be on their way; the retry is a new request.
    let second = await controller.next("daemon.register");
    while (second.id === first.id) second = await controller.next("daemon.register");
    expect(second).toMatchObject({ host: 2, incarnation: first.incarnation });
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: second.id });
    await daemon.ready();
  });
});
