/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C side of perfbed.ko: what the 6.12 Rust kernel crate has no
 * abstraction for. driver.rs holds the PMU logic; hw.rs declares these
 * functions again (in an `extern "C"` block) and wraps them safely.
 */
#ifndef PERFBED_GLUE_H
#define PERFBED_GLUE_H

#include <linux/types.h>

struct perf_event;
struct perfbed_poller;

/* The `device=<size>@<base>` module parameter (NUL-terminated, read-only). */
const char *perfbed_device_param(void);

/* MMIO. */
void __iomem *perfbed_ioremap(u64 base, u64 size);
void perfbed_iounmap(void __iomem *addr);
u64 perfbed_readq(const void __iomem *addr, u64 offset);
void perfbed_writeq(void __iomem *addr, u64 offset, u64 value);

/* Runs fn(data) on @cpu with interrupts off and waits; -ENXIO if it is offline. */
int perfbed_run_on_cpu(unsigned int cpu, void (*fn)(void *), void *data);
/* Runs fn(data) on this CPU with interrupts off. */
void perfbed_run_irqs_off(void (*fn)(void *), void *data);

/* One ratelimit state for all of the driver's warnings. */
bool perfbed_ratelimit(void);

/*
 * A delayed work that calls fn(data) in process context every @period_ms
 * after perfbed_poller_kick(), for as long as fn returns true.
 */
struct perfbed_poller *perfbed_poller_create(bool (*fn)(void *), void *data,
					     unsigned int period_ms);
void perfbed_poller_kick(struct perfbed_poller *poller);
void perfbed_poller_kick_now(struct perfbed_poller *poller);
void perfbed_poller_destroy(struct perfbed_poller *poller);

/*
 * The CPUs that share @cpu's level-3 cache by the kernel's cacheinfo (what
 * /sys/devices/system/cpu/cpuN/cache/index3/shared_cpu_list shows), as a
 * mask of CPUs 0-63 in *@shared. -ENXIO if @cpu is offline, -ENOENT if it
 * has no level-3 leaf, -ERANGE if a sharer is CPU 64 or above. Sleeps (the
 * CPU hotplug lock).
 */
int perfbed_l3_shared_cpus(unsigned int cpu, u64 *shared);

#endif /* PERFBED_GLUE_H */
