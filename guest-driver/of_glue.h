/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C side of finding the device in the device tree (of.rs declares it
 * again and wraps it safely). Built only with CONFIG_OF.
 */
#ifndef PERFBED_OF_GLUE_H
#define PERFBED_OF_GLUE_H

#include <linux/types.h>

/* The compatible string of the device's node (images/qemu/arm64/ adds it). */
#define PERFBED_OF_COMPATIBLE "perfbed,monitor"

/*
 * Finds the device's node: its first `reg` range in *base and *size, and
 * its n-th interrupt, mapped to a Linux IRQ through the node's interrupt
 * parent, in irqs[n] for n below @max_irqs (0 where it has none).
 * 0, or -ENODEV without such a node, or the error reading its `reg`.
 */
int perfbed_of_find(u64 *base, u64 *size, unsigned int *irqs,
		    unsigned int max_irqs);

#endif /* PERFBED_OF_GLUE_H */
