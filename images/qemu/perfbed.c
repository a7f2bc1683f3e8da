/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * perfbed: QEMU's side of perfbed's monitoring device.
 *
 *   -device perfbed,addr=0xfe000000,domains=0-1:2-3,control=/path/ctl.sock
 *                  [,trace-capacity=N][,irqs=13:14]
 *
 * Everything the device does is in Rust (perfbed.h); this file maps its
 * register block into system memory and hands each access over together with
 * the index of the vCPU that made it, which the device needs to enforce its
 * per-CPU placement rules. QEMU holds its global lock around MMIO here, so
 * the Rust side never blocks on anything slow.
 *
 * Interrupts: `irqs` gives each domain's GSI, domains separated by ':' (the
 * first ones only; a domain without one has no line). The machine's GSIs
 * (microvm's IOAPIC pins) are wired like any platform device's. The device
 * says "a line may have changed" from whichever thread changed it, never
 * under its own lock: a vCPU's MMIO access (we hold the global lock), or
 * its ticker and control socket threads (we do not). Under the lock the
 * line is set at once; otherwise a bottom half sets it from the main loop.
 * Either way the level applied is the device's current one, read then, so
 * the order in which two threads' news arrive does not matter.
 */

#include "qemu/osdep.h"
#include "qapi/error.h"
#include "qemu/module.h"
#include "exec/address-spaces.h"
#include "exec/memory.h"
#include "hw/core/cpu.h"
#include "hw/i386/x86.h"
#include "hw/irq.h"
#include "qemu/main-loop.h"
#include "hw/qdev-core.h"
#include "hw/qdev-properties.h"
#include "qom/object.h"
#include "perfbed.h"

#define TYPE_PERFBED "perfbed"
OBJECT_DECLARE_SIMPLE_TYPE(PerfbedState, PERFBED)

struct PerfbedState {
    DeviceState parent_obj;

    MemoryRegion mmio;
    struct perfbed_device *dev;

    /* properties */
    uint64_t addr;
    char *domains;
    uint32_t rmids;
    uint32_t slots;
    uint32_t width;
    uint64_t max_rate;
    char *control;
    uint32_t trace_capacity;
    char *irqs;

    /* interrupts: lines[d] is domain d's GSI (NULL: none) */
    uint32_t nlines;
    qemu_irq lines[PERFBED_MAX_LINES];
    bool level[PERFBED_MAX_LINES];
    QEMUBH *line_bh;
};

/* Under the global lock: each line to the device's level now. */
static void perfbed_apply_lines(PerfbedState *s)
{
    uint32_t d;

    for (d = 0; d < s->nlines; d++) {
        bool level = perfbed_device_line_level(s->dev, d);

        if (s->lines[d] && level != s->level[d]) {
            s->level[d] = level;
            qemu_set_irq(s->lines[d], level);
        }
    }
}

static void perfbed_line_bh(void *opaque)
{
    perfbed_apply_lines(opaque);
}

/* From any thread, never under the device's lock. */
static void perfbed_line_changed(void *opaque, uint32_t domain, bool asserted)
{
    PerfbedState *s = opaque;

    if (qemu_mutex_iothread_locked()) {
        perfbed_apply_lines(s);
    } else {
        qemu_bh_schedule(s->line_bh);
    }
}

/* Parses `irqs` ("13:14") into s->lines; false with *errp set on a bad one. */
static bool perfbed_wire_lines(PerfbedState *s, Error **errp)
{
    X86MachineState *x86ms;
    char **gsis;
    uint32_t n;

    if (!s->irqs || !*s->irqs) {
        return true;
    }
    x86ms = (X86MachineState *)object_dynamic_cast(qdev_get_machine(),
                                                   TYPE_X86_MACHINE);
    if (!x86ms || !x86ms->gsi) {
        error_setg(errp, "perfbed: irqs= needs an x86 machine with GSIs");
        return false;
    }
    gsis = g_strsplit(s->irqs, ":", 0);
    for (n = 0; gsis[n]; n++) {
        uint64_t gsi;

        if (n >= PERFBED_MAX_LINES || n >= perfbed_device_domains(s->dev)) {
            error_setg(errp, "perfbed: irqs=%s names more GSIs than domains",
                       s->irqs);
            g_strfreev(gsis);
            return false;
        }
        if (qemu_strtou64(gsis[n], NULL, 10, &gsi) < 0 || gsi >= IOAPIC_NUM_PINS) {
            error_setg(errp, "perfbed: irqs=%s: '%s' is not a GSI below %d",
                       s->irqs, gsis[n], IOAPIC_NUM_PINS);
            g_strfreev(gsis);
            return false;
        }
        s->lines[n] = x86ms->gsi[gsi];
    }
    g_strfreev(gsis);
    s->nlines = n;
    s->line_bh = qemu_bh_new(perfbed_line_bh, s);
    if (!perfbed_device_connect_lines(s->dev, perfbed_line_changed, s)) {
        error_setg(errp, "perfbed: cannot start the device's interrupt ticker");
        return false;
    }
    return true;
}

static uint32_t accessing_vcpu(void)
{
    return current_cpu ? (uint32_t)current_cpu->cpu_index : PERFBED_NO_VCPU;
}

static uint64_t perfbed_mmio_read(void *opaque, hwaddr offset, unsigned size)
{
    PerfbedState *s = opaque;

    return perfbed_device_read(s->dev, accessing_vcpu(), offset, size);
}

static void perfbed_mmio_write(void *opaque, hwaddr offset, uint64_t value,
                               unsigned size)
{
    PerfbedState *s = opaque;

    perfbed_device_write(s->dev, accessing_vcpu(), offset, size, value);
}

/* Every size reaches the device unsplit, so it can count the odd ones. */
static const MemoryRegionOps perfbed_mmio_ops = {
    .read = perfbed_mmio_read,
    .write = perfbed_mmio_write,
    .endianness = DEVICE_LITTLE_ENDIAN,
    .valid = { .min_access_size = 1, .max_access_size = 8 },
    .impl = { .min_access_size = 1, .max_access_size = 8 },
};

static void perfbed_realize(DeviceState *dev, Error **errp)
{
    PerfbedState *s = PERFBED(dev);
    char *error = NULL;

    s->dev = perfbed_device_new(s->domains ? s->domains : "", s->rmids,
                                s->slots, s->width, s->max_rate, s->control,
                                s->trace_capacity, &error);
    if (!s->dev) {
        error_setg(errp, "perfbed: %s", error ? error : "cannot create the device");
        perfbed_string_free(error);
        return;
    }
    if (!perfbed_wire_lines(s, errp)) {
        perfbed_device_free(s->dev);
        s->dev = NULL;
        return;
    }
    memory_region_init_io(&s->mmio, OBJECT(s), &perfbed_mmio_ops, s, "perfbed",
                          perfbed_device_size(s->dev));
    memory_region_add_subregion(get_system_memory(), s->addr, &s->mmio);
}

static void perfbed_unrealize(DeviceState *dev)
{
    PerfbedState *s = PERFBED(dev);

    memory_region_del_subregion(get_system_memory(), &s->mmio);
    /* Joins the ticker and the control socket: no more line news after it. */
    perfbed_device_free(s->dev);
    s->dev = NULL;
    if (s->line_bh) {
        qemu_bh_delete(s->line_bh);
        s->line_bh = NULL;
    }
}

static Property perfbed_properties[] = {
    DEFINE_PROP_UINT64("addr", PerfbedState, addr, 0xfe000000),
    DEFINE_PROP_STRING("domains", PerfbedState, domains),
    DEFINE_PROP_UINT32("rmids", PerfbedState, rmids, 0),
    DEFINE_PROP_UINT32("slots", PerfbedState, slots, 0),
    DEFINE_PROP_UINT32("width", PerfbedState, width, 0),
    DEFINE_PROP_UINT64("max-rate", PerfbedState, max_rate, 0),
    DEFINE_PROP_STRING("control", PerfbedState, control),
    DEFINE_PROP_UINT32("trace-capacity", PerfbedState, trace_capacity,
                       PERFBED_TRACE_DEFAULT),
    DEFINE_PROP_STRING("irqs", PerfbedState, irqs),
    DEFINE_PROP_END_OF_LIST(),
};

static void perfbed_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);

    dc->realize = perfbed_realize;
    dc->unrealize = perfbed_unrealize;
    dc->desc = "perfbed memory-bandwidth monitoring device";
    dc->user_creatable = true;
    device_class_set_props(dc, perfbed_properties);
    set_bit(DEVICE_CATEGORY_MISC, dc->categories);
}

static const TypeInfo perfbed_info = {
    .name = TYPE_PERFBED,
    .parent = TYPE_DEVICE,
    .instance_size = sizeof(PerfbedState),
    .class_init = perfbed_class_init,
};

static void perfbed_register_types(void)
{
    type_register_static(&perfbed_info);
}

type_init(perfbed_register_types)
