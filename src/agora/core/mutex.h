// Mutex and MutexLock: std::mutex with clang's thread-safety annotations, so that a member
// declared GUARDED_BY(mutex_) is checked at compile time (-Wthread-safety, on in clang builds)
// to be touched only with mutex_ held. Under GCC the annotations compile to nothing.
//
// Usage, as in LevelDB:
//   Mutex mutex_;
//   std::deque<Message> queue_ GUARDED_BY(mutex_);
//   void push(Message m) { MutexLock lock(mutex_); queue_.push_back(std::move(m)); }
// A condition variable waits on the Mutex itself (std::condition_variable_any).
#pragma once

#include <mutex>

#if defined(__clang__)
#define AGORA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define AGORA_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) AGORA_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY AGORA_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) AGORA_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) AGORA_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRE(...) AGORA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) AGORA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define REQUIRES(...) AGORA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) AGORA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS AGORA_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace agora {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace agora
