/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The C ABI of perfbed's monitoring device, implemented in Rust by the
 * `perfbed-qemu` crate (images/qemu/ffi). The device, its state and its
 * control socket all live on the Rust side; QEMU only maps the registers.
 */
#ifndef PERFBED_H
#define PERFBED_H

#include <stdbool.h>
#include <stdint.h>

/* The vCPU index passed when an access comes from no vCPU (e.g. the monitor). */
#define PERFBED_NO_VCPU UINT32_MAX
/* The trace_capacity that means "the device's default" (4096 records). */
#define PERFBED_TRACE_DEFAULT UINT32_MAX
/* Most interrupt lines a device has (one per domain, at most 16 domains). */
#define PERFBED_MAX_LINES 16

struct perfbed_device;

/*
 * Creates the device. `domains` lists each domain's allowed vCPUs, domains
 * separated by ':' ("0-1:2-3"); 0 for rmids/slots/width/max_rate means the
 * device's default. `control` is the control socket's path, or NULL for none.
 * `trace_capacity` is how many trace records the device keeps (0 none,
 * PERFBED_TRACE_DEFAULT its default).
 * On failure returns NULL and sets *error to a message the caller frees with
 * perfbed_string_free().
 */
struct perfbed_device *perfbed_device_new(const char *domains, uint32_t rmids,
                                          uint32_t slots, uint32_t width,
                                          uint64_t max_rate, const char *control,
                                          uint32_t trace_capacity, char **error);
/* Size in bytes of the register block (a multiple of 4 KiB). */
uint64_t perfbed_device_size(const struct perfbed_device *dev);
/* Never block for long and never fail: bad accesses are the device's business. */
uint64_t perfbed_device_read(struct perfbed_device *dev, uint32_t vcpu,
                             uint64_t offset, uint32_t size);
void perfbed_device_write(struct perfbed_device *dev, uint32_t vcpu,
                          uint64_t offset, uint32_t size, uint64_t value);
/* Number of domains (one interrupt line each). */
uint32_t perfbed_device_domains(const struct perfbed_device *dev);
/*
 * Wires the interrupt lines: from now on `changed(opaque, domain, level)` is
 * called whenever a domain's line may have changed level, from any thread
 * (a vCPU's access, the control socket, the ticker that lets time pass while
 * an overflow interrupt is enabled), never under the device's lock; apply
 * perfbed_device_line_level() when acting on it. Once per device; false if
 * already wired or the ticker cannot start.
 */
bool perfbed_device_connect_lines(struct perfbed_device *dev,
                                  void (*changed)(void *opaque, uint32_t domain,
                                                  bool level),
                                  void *opaque);
/* The level of domain `domain`'s line now (false for no such domain). */
bool perfbed_device_line_level(struct perfbed_device *dev, uint32_t domain);
/* Stops the ticker and the control socket and frees the device. */
void perfbed_device_free(struct perfbed_device *dev);
void perfbed_string_free(char *s);

#endif
