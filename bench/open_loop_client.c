/* An open-loop HTTP/1.1 load generator: one thread, epoll, no allocation per request.
 *
 * Why C: the Python generator that bench/overload_bench.py used could not offer 3x the
 * small model's capacity on two cores (it sent a third of the schedule) and took up to
 * 0.8 of the cores the worker needed, so an open-loop row measured the generator.
 *
 * Semantics are the Python client's (bench/overload_bench.py, open_loop):
 * - request i is due at start + i / rate, whatever the answers; it leaves on a free
 *   keep-alive connection, else on a new one (a new client arriving), up to max_slots
 *   connections in all; past that it is a client-side drop (status 0, not sent);
 * - a connection the server answered `Connection: close` on, or closed while idle, is
 *   not reused: its slot opens a new connection for its next request;
 * - latency counts from the due time (client-side queueing and connecting included);
 *   send lag is due time to the write; a connection that fails is status -1.
 *
 *   open_loop_client PORT RATE DURATION_S CONNECTIONS MAX_SLOTS REQUEST_FILE OUT_FILE
 *
 * OUT_FILE gets one record per scheduled request: int32 status, float32 latency_s,
 * float32 send_lag_s (NaN when nothing was written; little-endian, packed), in completion
 * order. Loopback only.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUFFER_BYTES 65536
#define DRAIN_LIMIT_S 40.0 /* past the worker's 10 s deadline and the 20 s of wrk's timeout */

enum state { DEAD, CONNECTING, IDLE, BUSY };

struct slot {
    int fd;
    enum state state;
    double due_s, sent_s;
    size_t written, received;
    char *buffer;
};

#pragma pack(push, 1)
struct record { int32_t status; float latency_s; float send_lag_s; };
#pragma pack(pop)

static const char *request;
static size_t request_bytes;
static struct sockaddr_in address;
static int epoll_fd;
static struct slot *slots;
static int *free_stack, free_count;
static struct record *records;
static long record_count, in_flight;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void record(int status, double due_s, double sent_s, double done_s) {
    records[record_count++] = (struct record){status, (float)(done_s - due_s), (float)(sent_s >= 0 ? sent_s - due_s : NAN)};
}

static void watch(int index, uint32_t events) {
    struct epoll_event event = {.events = events, .data.u32 = (uint32_t)index};
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, slots[index].fd, &event);
}

static void close_slot(int index) {
    if (slots[index].fd >= 0) close(slots[index].fd); /* close also removes it from epoll */
    slots[index].fd = -1;
    slots[index].state = DEAD;
}

static void release(int index) { free_stack[free_count++] = index; }

static void fail(int index) {
    record(-1, slots[index].due_s, slots[index].sent_s, now_s());
    in_flight--;
    close_slot(index);
    release(index);
}

/* Starts a non-blocking connect on the slot; the request goes out once it completes. */
static int open_connection(int index) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct epoll_event event = {.events = EPOLLOUT, .data.u32 = (uint32_t)index};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    slots[index].fd = fd;
    slots[index].state = CONNECTING;
    return 0;
}

/* A keep-alive connection opened before the clock starts (blocking connect). */
static void connect_now(int index) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    slots[index].fd = -1;
    slots[index].state = DEAD;
    if (fd < 0) return;
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0) { close(fd); return; }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)index};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    slots[index].fd = fd;
    slots[index].state = IDLE;
}

static void send_request(int index) {
    struct slot *s = &slots[index];
    if (s->written == 0) s->sent_s = now_s();
    ssize_t n = write(s->fd, request + s->written, request_bytes - s->written);
    if (n < 0 && errno != EAGAIN) { fail(index); return; }
    if (n > 0) s->written += (size_t)n;
    s->state = BUSY;
    watch(index, s->written < request_bytes ? EPOLLOUT : EPOLLIN);
}

static void start(int index, double due_s) {
    struct slot *s = &slots[index];
    s->due_s = due_s, s->sent_s = -1, s->written = 0, s->received = 0;
    in_flight++;
    if (s->state == DEAD && open_connection(index) < 0) { fail(index); return; }
    if (s->state == IDLE) send_request(index);
}

/* Returns the response's total length once it is all in the buffer, else 0; sets
 * *status and *keep_alive. */
static size_t complete_response(struct slot *s, int *status, int *keep_alive) {
    s->buffer[s->received] = 0;
    char *end = strstr(s->buffer, "\r\n\r\n");
    if (end == NULL) return 0;
    size_t head_bytes = (size_t)(end - s->buffer) + 4, body_bytes = 0;
    *status = atoi(s->buffer + 9);
    *keep_alive = 1;
    for (char *line = strstr(s->buffer, "\r\n"); line != NULL && line < end; line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, "content-length:", 15) == 0) body_bytes = strtoul(line + 17, NULL, 10);
        if (strncasecmp(line + 2, "connection:", 11) == 0) {
            const char *value = line + 13 + strspn(line + 13, " ");
            if (strncasecmp(value, "close", 5) == 0) *keep_alive = 0;
        }
    }
    return s->received >= head_bytes + body_bytes ? head_bytes + body_bytes : 0;
}

static void readable(int index) {
    struct slot *s = &slots[index];
    ssize_t n = read(s->fd, s->buffer + s->received, BUFFER_BYTES - 1 - s->received);
    if (n < 0 && errno == EAGAIN) return;
    if (s->state == IDLE) { close_slot(index); return; } /* closed by the server while idle */
    if (n <= 0) { fail(index); return; }
    s->received += (size_t)n;
    int status, keep_alive;
    if (complete_response(s, &status, &keep_alive) == 0) {
        if (s->received >= BUFFER_BYTES - 1) fail(index);
        return;
    }
    record(status, s->due_s, s->sent_s, now_s());
    in_flight--;
    if (keep_alive) s->state = IDLE;
    else close_slot(index);
    release(index);
}

static void ready(struct epoll_event *event) {
    int index = (int)event->data.u32;
    struct slot *s = &slots[index];
    if (s->state == CONNECTING) {
        int error = 0;
        socklen_t length = sizeof error;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error != 0 || (event->events & (EPOLLERR | EPOLLHUP))) { fail(index); return; }
        s->state = IDLE;
        send_request(index);
    } else if (s->state == BUSY && s->written < request_bytes) {
        send_request(index);
    } else if (s->state == IDLE || s->state == BUSY) {
        readable(index);
    }
}

static char *read_file(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    *bytes = (size_t)ftell(f);
    rewind(f);
    char *data = malloc(*bytes);
    if (fread(data, 1, *bytes, f) != *bytes) { perror(path); exit(2); }
    fclose(f);
    return data;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s PORT RATE DURATION_S CONNECTIONS MAX_SLOTS REQUEST_FILE OUT_FILE\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), connections = atoi(argv[4]), max_slots = atoi(argv[5]);
    double rate = atof(argv[2]), duration_s = atof(argv[3]);
    long total = (long)(rate * duration_s);
    request = read_file(argv[6], &request_bytes);
    address = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    epoll_fd = epoll_create1(0);
    slots = calloc((size_t)max_slots, sizeof *slots);
    free_stack = calloc((size_t)max_slots, sizeof *free_stack);
    records = calloc((size_t)total + 1, sizeof *records);
    char *buffers = malloc((size_t)max_slots * BUFFER_BYTES);
    int opened = 0;
    struct epoll_event events[512];

    for (; opened < connections && opened < max_slots; opened++) { /* keep-alive connections, open before the clock starts */
        slots[opened].buffer = buffers + (size_t)opened * BUFFER_BYTES;
        connect_now(opened);
        release(opened);
    }
    long scheduled = 0, drops = 0;
    double started_s = now_s(), interval_s = 1.0 / rate;
    while (scheduled < total || (in_flight > 0 && now_s() - started_s < duration_s + DRAIN_LIMIT_S)) {
        double now = now_s();
        for (; scheduled < total && started_s + scheduled * interval_s <= now; scheduled++) {
            double due_s = started_s + scheduled * interval_s;
            if (free_count > 0) {
                start(free_stack[--free_count], due_s);
            } else if (opened < max_slots) {
                slots[opened].buffer = buffers + (size_t)opened * BUFFER_BYTES;
                slots[opened].fd = -1;
                start(opened++, due_s);
            } else {
                record(0, due_s, -1, due_s);
                drops++;
            }
        }
        struct timespec timeout = {0, 0};
        if (scheduled < total) {
            double wait_s = started_s + scheduled * interval_s - now_s();
            if (wait_s > 0) timeout.tv_nsec = (long)((wait_s < 0.5 ? wait_s : 0.5) * 1e9);
        } else {
            timeout.tv_nsec = 100000000;
        }
        int n = epoll_pwait2(epoll_fd, events, 512, &timeout, NULL);
        for (int i = 0; i < n; i++) ready(&events[i]);
    }
    double elapsed_s = now_s() - started_s;
    for (int index = 0; index < opened; index++) /* still unanswered at the drain limit: failed */
        if (slots[index].state == BUSY || slots[index].state == CONNECTING) record(-1, slots[index].due_s, slots[index].sent_s, now_s());
    FILE *out = fopen(argv[7], "wb");
    if (out == NULL || fwrite(records, sizeof *records, (size_t)record_count, out) != (size_t)record_count) { perror(argv[7]); return 2; }
    fclose(out);
    printf("scheduled %ld recorded %ld drops %ld unanswered %ld slots %d elapsed_s %.3f\n", scheduled, record_count, drops,
           in_flight, opened, elapsed_s);
    return 0;
}
