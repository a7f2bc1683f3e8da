// SPDX-License-Identifier: GPL-2.0
/*
 * The C side of finding the device in the device tree (of.rs), on boards
 * that describe their devices there, as arm64's do. No logic here but the
 * lookups 6.12's Rust has no binding for.
 */

#include <linux/ioport.h>
#include <linux/of.h>
#include <linux/of_address.h>
#include <linux/of_irq.h>

#include "of_glue.h"

int perfbed_of_find(u64 *base, u64 *size, unsigned int *irqs,
		    unsigned int max_irqs)
{
	struct device_node *np;
	struct resource res;
	unsigned int i;
	int err;

	np = of_find_compatible_node(NULL, NULL, PERFBED_OF_COMPATIBLE);
	if (!np)
		return -ENODEV;
	err = of_address_to_resource(np, 0, &res);
	if (!err) {
		*base = res.start;
		*size = resource_size(&res);
		/* Creates the mapping in the GIC's domain; 0 past the last. */
		for (i = 0; i < max_irqs; i++)
			irqs[i] = irq_of_parse_and_map(np, i);
	}
	of_node_put(np);
	return err;
}
