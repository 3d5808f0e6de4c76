/* Runs the fuzz target over files and directories of inputs once each, without libFuzzer: the
 * committed corpus becomes a regression test in every build, sanitized or not, with any
 * compiler. Usage: fuzz_attention_replay [--large-problems] PATH...; as under libFuzzer, the
 * arguments that start with "--" are the target's own. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int run_file(const char* path) {
    FILE* file = fopen(path, "rb");
    if (!file) {
        perror(path);
        return 0;
    }
    uint8_t* data = NULL;
    size_t size = 0, capacity = 0, got;
    uint8_t chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, file)) > 0) {
        if (size + got > capacity) {
            capacity = (size + got) * 2;
            data = (uint8_t*)realloc(data, capacity);
        }
        memcpy(data + size, chunk, got);
        size += got;
    }
    fclose(file);
    /* An exactly-sized copy, so reading past the input is caught as in libFuzzer. */
    uint8_t* exact = (uint8_t*)malloc(size ? size : 1);
    if (size) memcpy(exact, data, size);
    free(data);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    return 1;
}

static int compare_names(const void* a, const void* b) {
    return strcmp(*(char* const*)a, *(char* const*)b);
}

/* Files of a directory in name order, so runs are reproducible. */
static int run_directory(const char* path) {
    DIR* dir = opendir(path);
    if (!dir) {
        perror(path);
        return -1;
    }
    char** names = NULL;
    size_t count = 0;
    for (struct dirent* entry; (entry = readdir(dir)) != NULL;) {
        if (entry->d_name[0] == '.') continue;
        names = (char**)realloc(names, (count + 1) * sizeof *names);
        names[count] = (char*)malloc(strlen(path) + strlen(entry->d_name) + 2);
        sprintf(names[count++], "%s/%s", path, entry->d_name);
    }
    closedir(dir);
    qsort(names, count, sizeof *names, compare_names);
    int ran = 0;
    for (size_t i = 0; i < count; ++i) {
        ran += run_file(names[i]);
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char** argv) {
    LLVMFuzzerInitialize(&argc, &argv);
    int ran = 0, paths = 0;
    for (int i = 1; i < argc; ++i) {
        if (strncmp(argv[i], "--", 2) == 0) continue;
        ++paths;
        struct stat info;
        if (stat(argv[i], &info) != 0) {
            perror(argv[i]);
            return 1;
        }
        const int n = S_ISDIR(info.st_mode) ? run_directory(argv[i]) : run_file(argv[i]);
        if (n <= 0) {
            fprintf(stderr, "%s: no inputs\n", argv[i]);
            return 1;
        }
        ran += n;
    }
    if (paths == 0) {
        fprintf(stderr, "usage: %s [--large-problems] FILE_OR_DIRECTORY...\n", argv[0]);
        return 2;
    }
    printf("fuzz_attention_replay: %d inputs ran without a finding\n", ran);
    return 0;
}
