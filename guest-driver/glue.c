// SPDX-License-Identifier: GPL-2.0
/*
 * The C side of perfbed.ko, kept small and free of logic: the module
 * parameter, MMIO, cross-CPU calls, a self-rearming delayed work, the
 * kernel's cacheinfo and an event attribute the Rust abstraction lacks.
 * See glue.h; the driver itself is in driver.rs.
 */

#include <linux/cacheinfo.h>
#include <linux/cpu.h>
#include <linux/io.h>
#include <linux/irqflags.h>
#include <linux/jiffies.h>
#include <linux/moduleparam.h>
#include <linux/perf_event.h>
#include <linux/ratelimit.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/workqueue.h>

#include "glue.h"

static char device[64];
module_param_string(device, device, sizeof(device), 0444);
MODULE_PARM_DESC(device, "the device's registers: <size>@<base>, in hex (e.g. 0x3000@0xfe000000)");

const char *perfbed_device_param(void)
{
	return device;
}

void __iomem *perfbed_ioremap(u64 base, u64 size)
{
	return ioremap(base, size);
}

void perfbed_iounmap(void __iomem *addr)
{
	iounmap(addr);
}

u64 perfbed_readq(const void __iomem *addr, u64 offset)
{
	return readq(addr + offset);
}

void perfbed_writeq(void __iomem *addr, u64 offset, u64 value)
{
	writeq(value, addr + offset);
}

int perfbed_run_on_cpu(unsigned int cpu, void (*fn)(void *), void *data)
{
	return smp_call_function_single(cpu, fn, data, 1);
}

void perfbed_run_irqs_off(void (*fn)(void *), void *data)
{
	unsigned long flags;

	local_irq_save(flags);
	fn(data);
	local_irq_restore(flags);
}

static DEFINE_RATELIMIT_STATE(perfbed_rs, DEFAULT_RATELIMIT_INTERVAL, DEFAULT_RATELIMIT_BURST);

bool perfbed_ratelimit(void)
{
	return __ratelimit(&perfbed_rs);
}

struct perfbed_poller {
	struct delayed_work work;
	bool (*fn)(void *data);
	void *data;
	unsigned long period;
};

static void perfbed_poller_work(struct work_struct *work)
{
	struct perfbed_poller *poller =
		container_of(to_delayed_work(work), struct perfbed_poller, work);

	if (poller->fn(poller->data))
		schedule_delayed_work(&poller->work, poller->period);
}

struct perfbed_poller *perfbed_poller_create(bool (*fn)(void *), void *data,
					     unsigned int period_ms)
{
	struct perfbed_poller *poller = kzalloc(sizeof(*poller), GFP_KERNEL);

	if (!poller)
		return NULL;
	INIT_DELAYED_WORK(&poller->work, perfbed_poller_work);
	poller->fn = fn;
	poller->data = data;
	poller->period = max(msecs_to_jiffies(period_ms), 1UL);
	return poller;
}

/* Safe in atomic context: only arms a timer (the period is never 0). */
void perfbed_poller_kick(struct perfbed_poller *poller)
{
	schedule_delayed_work(&poller->work, poller->period);
}

/* Safe in atomic context: queues the work at once, or moves its timer up. */
void perfbed_poller_kick_now(struct perfbed_poller *poller)
{
	mod_delayed_work(system_wq, &poller->work, 0);
}

void perfbed_poller_destroy(struct perfbed_poller *poller)
{
	/* Also waits out a work that re-arms itself. */
	cancel_delayed_work_sync(&poller->work);
	kfree(poller);
}

int perfbed_l3_shared_cpus(unsigned int cpu, u64 *shared)
{
	struct cpu_cacheinfo *cci;
	unsigned int i, sharer;
	int ret = -ENOENT;

	/* Hotplug updates the sibling maps and may free an offline CPU's leaves. */
	cpus_read_lock();
	if (cpu >= nr_cpu_ids || !cpu_online(cpu)) {
		ret = -ENXIO;
		goto out;
	}
	cci = get_cpu_cacheinfo(cpu);
	for (i = 0; cci->info_list && i < cci->num_leaves; i++) {
		struct cacheinfo *leaf = cci->info_list + i;

		if (leaf->level != 3)
			continue;
		*shared = 0;
		ret = 0;
		for_each_cpu(sharer, &leaf->shared_cpu_map) {
			if (sharer >= 64) {
				ret = -ERANGE;
				break;
			}
			*shared |= 1ULL << sharer;
		}
		break;
	}
out:
	cpus_read_unlock();
	return ret;
}
