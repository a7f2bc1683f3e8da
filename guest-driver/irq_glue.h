/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C side of perfbed.ko's interrupts; irq.rs declares these again and
 * wraps them safely.
 */
#ifndef PERFBED_IRQ_GLUE_H
#define PERFBED_IRQ_GLUE_H

#include <linux/types.h>

struct perfbed_irq;

/*
 * Requests interrupt @irq: fn(data) runs in hard interrupt context (with
 * interrupts off) and says whether the interrupt was the device's. @name is
 * copied. NULL and *err on failure. May sleep.
 */
struct perfbed_irq *perfbed_irq_request(unsigned int irq, bool (*fn)(void *),
					void *data, const char *name, int *err);
/* irq_set_affinity() to @cpu alone; never sleeps. */
int perfbed_irq_set_affinity(struct perfbed_irq *line, unsigned int cpu);
/*
 * irq_set_affinity() to the online CPUs outside the bitmask @cpus (all
 * online CPUs if that leaves none). May sleep (it allocates a cpumask).
 */
int perfbed_irq_set_affinity_away(struct perfbed_irq *line, u64 cpus);
/* Frees the interrupt, waiting for a running handler; may sleep. */
void perfbed_irq_free(struct perfbed_irq *line);

#endif /* PERFBED_IRQ_GLUE_H */
