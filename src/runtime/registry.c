/* registry.c — the library's lifetime and its device list: probes every backend at
 * clpar_init, names the devices (opencl:N, cuda:N, host), and selects and orders them from
 * CLPAR_DEVICES or, by default, every OpenCL and CUDA device with GPUs first. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static clpar_device **all_devices; /* every probed device, host included */
static int all_count;
static clpar_device **selected;
static int selected_count;
static clpar_device *host_device;
static const clpar_runtime_hooks *hooks; /* the layers above's, from the first init */

const char *clpar_version(void) {
  return CLPAR_VERSION_STRING;
}

int clpar_is_initialized(void) {
  return __atomic_load_n(&init_count, __ATOMIC_ACQUIRE) > 0;
}

clpar_device *clpar_device_host(void) {
  return clpar_is_initialized() ? host_device : NULL;
}

int clpar_device_probed_count(void) {
  return clpar_is_initialized() ? all_count : 0;
}

clpar_device *clpar_device_probed(int i) {
  return clpar_is_initialized() && i >= 0 && i < all_count ? all_devices[i] : NULL;
}

clpar_backend_device *clpar_backend_device_append(clpar_backend_device **devs, int *count) {
  clpar_backend_device *grown = realloc(*devs, (size_t)(*count + 1) * sizeof *grown);
  if (!grown) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory listing devices");
    return NULL;
  }
  *devs = grown;
  memset(&grown[*count], 0, sizeof grown[*count]);
  return &grown[(*count)++];
}

static void destroy_devices(void) {
  for (int i = 0; i < all_count; i++) /* every queue idle before any device goes */
    if (all_devices[i]->worker) clpar_worker_drain(all_devices[i]);
  clpar_storage_orphan_all(); /* tensors the user did not free: their memory goes now */
  if (hooks && hooks->stop) hooks->stop();
  clpar_capture_shutdown(); /* graphs left alive give their pools back */
  for (int i = 0; i < all_count; i++) {
    clpar_device *d = all_devices[i];
    clpar_allocator_destroy(d);
    clpar_staging_destroy(d);
    clpar_worker_stop(d);
    clpar_dev_destroy(d);
    pthread_mutex_destroy(&d->staging_lock);
    pthread_mutex_destroy(&d->alloc_lock);
    free(d);
  }
  free(all_devices);
  free(selected);
  all_devices = selected = NULL;
  all_count = selected_count = 0;
  host_device = NULL;
  hooks = NULL;
}

/* A backend must implement this ABI's every entry: a missing one would crash the first op
 * that needs it, so such a device is left out with a warning instead. */
static int iface_complete(const clpar_backend_iface *f) {
  if (!f || f->abi_version != CLPAR_BACKEND_ABI_VERSION) return 0;
  int complete = 1;
#define REQUIRED_(name, kind, required) \
  if (required && !f->name) complete = 0;
  CLPAR_BACKEND_ENTRIES(REQUIRED_)
#undef REQUIRED_
  return complete;
}

/* Runs one backend's probe and wraps what it found, numbering ids per backend. A driver's
 * error is logged; the user's configuration error (CLPAR_ERROR_INVALID_ARGUMENT, backend.h)
 * is returned, its message kept, for clpar_init to fail with. */
static clpar_status probe_backend(const char *name, clpar_backend_probe_fn probe) {
  clpar_backend_device *found = NULL;
  int n = 0;
  clpar_status s = probe(&found, &n), ret = CLPAR_OK;
  if (s == CLPAR_ERROR_INVALID_ARGUMENT)
    ret = s;
  else if (s != CLPAR_OK)
    clpar_log(CLPAR_LOG_WARN, "%s devices could not all be listed: %s", name, clpar_last_error());
  for (int i = 0; i < n; i++) {
    if (!iface_complete(found[i].iface)) {
      clpar_log(CLPAR_LOG_WARN,
                "%s device %d (%s) left out: its backend does not implement backend ABI %d", name,
                i, found[i].info.name, CLPAR_BACKEND_ABI_VERSION);
      found[i].iface->destroy(found[i].ctx);
      continue;
    }
    clpar_device *d = calloc(1, sizeof *d);
    clpar_device **grown = d ? realloc(all_devices, (size_t)(all_count + 1) * sizeof *grown) : NULL;
    if (!grown) {
      free(d);
      found[i].iface->destroy(found[i].ctx);
      clpar_log(CLPAR_LOG_ERROR, "out of host memory listing devices");
      continue;
    }
    all_devices = grown;
    d->bd = found[i];
    pthread_mutex_init(&d->alloc_lock, NULL);
    pthread_mutex_init(&d->staging_lock, NULL);
    snprintf(d->bd.info.backend, sizeof d->bd.info.backend, "%s", d->bd.iface->name);
    if (strcmp(name, "host") == 0)
      snprintf(d->bd.info.id, sizeof d->bd.info.id, "host");
    else
      snprintf(d->bd.info.id, sizeof d->bd.info.id, "%s:%d", name, i);
    clpar_compose_init(d);
    all_devices[all_count++] = d;
    clpar_log(CLPAR_LOG_INFO, "found %s: %s (%s)", d->bd.info.id, d->bd.info.name,
              d->bd.info.vendor);
  }
  free(found);
  return ret;
}

static void list_devices(char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < all_count && used < size; i++) {
    const clpar_device_info *in = &all_devices[i]->bd.info;
    used += (size_t)snprintf(buf + used, size - used, "%s%s (%s)", i ? ", " : "", in->id, in->name);
  }
}

static clpar_status select_add(clpar_device *d) {
  for (int i = 0; i < selected_count; i++)
    if (selected[i] == d)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "CLPAR_DEVICES names %s more than once",
                             d->bd.info.id);
  selected[selected_count++] = d;
  return CLPAR_OK;
}

/* A CLPAR_DEVICES value as an error message repeats it: quoted, and shortened, so that a long
 * one cannot push the list of devices out of the message. */
#define ECHO_MAX 64
static const char *echo_value(char *buf, size_t size, const char *v) {
  size_t len = strlen(v);
  if (len <= ECHO_MAX)
    snprintf(buf, size, "\"%s\"", v);
  else
    snprintf(buf, size, "\"%.*s...\" (%zu characters)", ECHO_MAX, v, len);
  return buf;
}

/* One entry of CLPAR_DEVICES: an id ("opencl:1") or a whole backend ("opencl"). */
static clpar_status select_entry(const char *entry) {
  int matched = 0;
  for (int i = 0; i < all_count; i++) {
    const clpar_device_info *in = &all_devices[i]->bd.info;
    if (strcmp(in->id, entry) == 0 || strcmp(in->backend, entry) == 0) {
      clpar_status s = select_add(all_devices[i]);
      if (s != CLPAR_OK) return s;
      matched = 1;
    }
  }
  if (matched) return CLPAR_OK;
  char avail[4096];
  list_devices(avail, sizeof avail);
  char echo[ECHO_MAX + 48];
  return clpar_set_error(CLPAR_ERROR_DEVICE_NOT_FOUND,
                         "CLPAR_DEVICES entry %s matches no device; the devices are: %s",
                         echo_value(echo, sizeof echo, entry), avail[0] ? avail : "(none)");
}

static clpar_status select_from_env(const char *spec) {
  char *copy = strdup(spec);
  if (!copy) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  clpar_status s = CLPAR_OK;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok && s == CLPAR_OK;
       tok = strtok_r(NULL, ",", &save)) {
    while (isspace((unsigned char)*tok)) tok++;
    char *end = tok + strlen(tok);
    while (end > tok && isspace((unsigned char)end[-1])) *--end = '\0';
    if (*tok) s = select_entry(tok);
  }
  free(copy);
  char echo[ECHO_MAX + 48];
  if (s == CLPAR_OK && selected_count == 0)
    s = clpar_set_error(CLPAR_ERROR_DEVICE_NOT_FOUND, "CLPAR_DEVICES=%s names no device",
                        echo_value(echo, sizeof echo, spec));
  return s;
}

/* Default: every non-host device, GPUs first (stable); host only when nothing else. */
static void select_default(void) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < all_count; i++) {
      clpar_device *d = all_devices[i];
      int gpu = d->bd.info.type == CLPAR_DEVICE_GPU;
      if (d != host_device && gpu == (pass == 0)) selected[selected_count++] = d;
    }
  if (selected_count == 0) selected[selected_count++] = host_device;
}

static clpar_status init_locked(void) {
  clpar_log_init_from_env();
  clpar_status started = hooks && hooks->start ? hooks->start() : CLPAR_OK;
  if (started != CLPAR_OK) return started;
  clpar_status probed = probe_backend("host", clpar_host_probe);
  if (all_count == 0) return CLPAR_ERROR_INTERNAL;
  host_device = all_devices[0];
#ifdef CLPAR_HAVE_OPENCL
  if (probed == CLPAR_OK) probed = probe_backend("opencl", clpar_opencl_probe);
#endif
#ifdef CLPAR_HAVE_CUDA
  if (probed == CLPAR_OK) probed = probe_backend("cuda", clpar_cuda_probe);
#endif
  if (probed != CLPAR_OK) return probed;
  selected = calloc((size_t)all_count, sizeof *selected);
  if (!selected) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  const char *spec = getenv("CLPAR_DEVICES");
  clpar_status s = CLPAR_OK;
  if (spec && *spec)
    s = select_from_env(spec);
  else
    select_default();
  if (s == CLPAR_OK) s = clpar_allocator_set_limits(all_devices, all_count);
  for (int i = 0; i < all_count; i++) all_devices[i]->index = -1;
  for (int i = 0; i < selected_count; i++) selected[i]->index = i;
  for (int i = 0; s == CLPAR_OK && i < all_count; i++)
    s = clpar_worker_start(all_devices[i], hooks ? hooks->worker_thread : NULL);
  for (int i = 0; s == CLPAR_OK && i < selected_count; i++)
    s = clpar_staging_reserve(selected[i], 2, (size_t)64 << 10);
  return s;
}

clpar_status clpar_runtime_init(const clpar_runtime_hooks *h) {
  pthread_mutex_lock(&registry_lock);
  clpar_status s = CLPAR_OK;
  if (init_count == 0) {
    clpar_clear_error();
    hooks = h;
    s = init_locked();
    if (s != CLPAR_OK) destroy_devices();
  }
  if (s == CLPAR_OK) __atomic_add_fetch(&init_count, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&registry_lock);
  return s;
}

void clpar_runtime_shutdown(void) {
  pthread_mutex_lock(&registry_lock);
  if (init_count > 0 && __atomic_sub_fetch(&init_count, 1, __ATOMIC_RELEASE) == 0)
    destroy_devices();
  pthread_mutex_unlock(&registry_lock);
}

int clpar_device_count(void) {
  return clpar_is_initialized() ? selected_count : 0;
}

clpar_device *clpar_device_get(int index) {
  if (!clpar_is_initialized()) {
    clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "clpar_device_get: call clpar_init first");
    return NULL;
  }
  if (index < 0 || index >= selected_count) {
    clpar_set_error(CLPAR_ERROR_DEVICE_NOT_FOUND, "device index %d: there are %d devices (0..%d)",
                    index, selected_count, selected_count - 1);
    return NULL;
  }
  return selected[index];
}

clpar_status clpar_device_find(const char *id, clpar_device **out) {
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "clpar_device_find: call clpar_init first");
  if (!id || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_device_find: NULL argument");
  for (int i = 0; i < selected_count; i++)
    if (strcmp(selected[i]->bd.info.id, id) == 0) {
      *out = selected[i];
      return CLPAR_OK;
    }
  char avail[4096];
  size_t used = 0;
  avail[0] = '\0';
  for (int i = 0; i < selected_count && used < sizeof avail; i++)
    used += (size_t)snprintf(avail + used, sizeof avail - used, "%s%s", i ? ", " : "",
                             selected[i]->bd.info.id);
  return clpar_set_error(CLPAR_ERROR_DEVICE_NOT_FOUND,
                         "no selected device \"%s\"; the selected devices are: %s", id, avail);
}

clpar_status clpar_device_get_info(const clpar_device *dev, clpar_device_info *info) {
  if (!dev || !info)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_device_get_info: NULL argument");
  *info = dev->bd.info;
  return CLPAR_OK;
}

const char *clpar_device_id(const clpar_device *dev) {
  return dev ? dev->bd.info.id : "(null)";
}

uint64_t clpar_device_host_waits(const clpar_device *dev) {
  return dev ? __atomic_load_n(&dev->host_waits, __ATOMIC_RELAXED) : 0;
}

int clpar_device_index(const clpar_device *dev) {
  return dev ? dev->index : -1;
}

static clpar_status profile_check(const char *fn, clpar_device *dev) {
  if (!dev) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL device", fn);
  const clpar_backend_iface *f = dev->bd.iface;
  if (!f->profile || !f->profile_read)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "%s: %s cannot be profiled (the %s backend records no device time)", fn,
                           dev->bd.info.id, f->name);
  return CLPAR_OK;
}

clpar_status clpar_device_profile_start(clpar_device *dev) {
  clpar_status s = profile_check("clpar_device_profile_start", dev);
  return s == CLPAR_OK ? clpar_dev_profile(dev, 1) : s;
}

clpar_status clpar_device_profile_read(clpar_device *dev, clpar_profile *out) {
  clpar_status s = profile_check("clpar_device_profile_read", dev);
  if (s == CLPAR_OK && !out)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_device_profile_read: out is NULL");
  return s == CLPAR_OK ? clpar_dev_profile_read_sync(dev, &out->device_seconds, &out->ops) : s;
}

clpar_status clpar_device_profile_stop(clpar_device *dev) {
  clpar_status s = profile_check("clpar_device_profile_stop", dev);
  return s == CLPAR_OK ? clpar_dev_profile_sync(dev, 0) : s;
}

clpar_status clpar_device_synchronize(clpar_device *dev) {
  if (!dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_device_synchronize: NULL device");
  return clpar_worker_drain(dev);
}

clpar_status clpar_device_counters_get(const clpar_device *dev, clpar_device_counters *out) {
  if (!dev || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_device_counters_get: NULL argument");
  out->host_waits = __atomic_load_n(&dev->host_waits, __ATOMIC_RELAXED);
  out->queue_waits = __atomic_load_n(&dev->queue_waits, __ATOMIC_RELAXED);
  out->transfers_in = __atomic_load_n(&dev->transfers_in, __ATOMIC_RELAXED);
  out->transfers_out = __atomic_load_n(&dev->transfers_out, __ATOMIC_RELAXED);
  out->bytes_in = __atomic_load_n(&dev->bytes_in, __ATOMIC_RELAXED);
  out->bytes_out = __atomic_load_n(&dev->bytes_out, __ATOMIC_RELAXED);
  out->backend_waits = __atomic_load_n(&dev->backend_waits, __ATOMIC_RELAXED);
  out->peer_copies = __atomic_load_n(&dev->peer_copies, __ATOMIC_RELAXED);
  return CLPAR_OK;
}
