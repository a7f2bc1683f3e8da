// SPDX-License-Identifier: GPL-2.0
/*
 * The C side of perfbed.ko's interrupts (irq.rs): request, affinity, free.
 * 6.12's Rust kernel crate has no interrupt abstraction; this is the least
 * C that gives irq.rs one. No logic here but the IRQ_HANDLED/IRQ_NONE
 * conversion.
 */

#include <linux/cpumask.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "irq_glue.h"

struct perfbed_irq {
	unsigned int irq;
	bool (*fn)(void *data);
	void *data;
	/* request_irq() keeps the pointer: the name lives as long as the line. */
	char name[32];
};

static irqreturn_t perfbed_irq_handler(int irq, void *dev_id)
{
	struct perfbed_irq *line = dev_id;

	return line->fn(line->data) ? IRQ_HANDLED : IRQ_NONE;
}

struct perfbed_irq *perfbed_irq_request(unsigned int irq, bool (*fn)(void *),
					void *data, const char *name, int *err)
{
	struct perfbed_irq *line = kzalloc(sizeof(*line), GFP_KERNEL);

	if (!line) {
		*err = -ENOMEM;
		return NULL;
	}
	line->irq = irq;
	line->fn = fn;
	line->data = data;
	strscpy(line->name, name, sizeof(line->name));
	/*
	 * The driver places the line itself (it follows the PMU's CPU), so
	 * irqbalance must leave it alone.
	 */
	*err = request_irq(irq, perfbed_irq_handler, IRQF_NOBALANCING,
			   line->name, line);
	if (*err) {
		kfree(line);
		return NULL;
	}
	return line;
}

int perfbed_irq_set_affinity(struct perfbed_irq *line, unsigned int cpu)
{
	if (cpu >= nr_cpu_ids)
		return -EINVAL;
	return irq_set_affinity(line->irq, cpumask_of(cpu));
}

int perfbed_irq_set_affinity_away(struct perfbed_irq *line, u64 cpus)
{
	cpumask_var_t mask;
	unsigned int cpu;
	int ret;

	if (!zalloc_cpumask_var(&mask, GFP_KERNEL))
		return -ENOMEM;
	cpumask_copy(mask, cpu_online_mask);
	for (cpu = 0; cpu < 64 && cpu < nr_cpu_ids; cpu++) {
		if (cpus & BIT_ULL(cpu))
			cpumask_clear_cpu(cpu, mask);
	}
	ret = irq_set_affinity(line->irq, cpumask_empty(mask) ? cpu_online_mask : mask);
	free_cpumask_var(mask);
	return ret;
}

void perfbed_irq_free(struct perfbed_irq *line)
{
	/* Waits for a running handler. */
	free_irq(line->irq, line);
	kfree(line);
}
